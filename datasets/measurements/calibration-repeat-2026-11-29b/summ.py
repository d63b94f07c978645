import json, sys, statistics, itertools
rows = [json.loads(l) for l in open(sys.argv[1])]
vs = list(dict.fromkeys(r["variant"] for r in rows))
for v in vs:
    mine = [r for r in rows if r["variant"] == v]
    def sp(vals): return (max(vals) - min(vals)) / statistics.median(vals)
    keys = list(mine[0]["preds"])
    allsp = {k: sp([r["preds"][k] for r in mine]) for k in keys}
    # spread over every triple of calibrations
    tri = []
    for c in itertools.combinations(mine, 3):
        s = [sp([r["preds"][k] for r in c]) for k in keys]
        tri.append((statistics.median(s), max(s)))
    print(f"== {v}: n={len(mine)} all-n median {statistics.median(allsp.values()):.1%} max {max(allsp.values()):.1%} ({max(allsp, key=allsp.get)}); "
          f"triples median-of-medians {statistics.median(t[0] for t in tri):.1%} median-of-max {statistics.median(t[1] for t in tri):.1%}; secs {[r['seconds'] for r in mine]} disturbed {[r['disturbed'] for r in mine]}")
    for k in sys.argv[2:] or ["allreduce_intra_4MiB_ms", "comm_scale", "alpha_scale", "compute_scale", "contention", "overlap_loss", "optimizer_per_byte", "adam_work"]:
        print(f"   {k:24s} {['%.3g' % r['params'][k] for r in mine]}")
