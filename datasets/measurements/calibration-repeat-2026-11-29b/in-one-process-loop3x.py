"""Fresh calibrations alternating variants; per calibration the fitted scalars and the predictions
(profile path) of four zoo models x builders at worlds 1 and 2; per variant the predictions' spread."""
import sys, time, json, warnings, statistics, dataclasses

def apply(variant):
    from distlab.calibration import measure
    measure.OVERHEAD_STEPS, measure.LONG_STEPS = (30, 18) if "loop3x" in variant else (10, 6)

if __name__ == "__main__":
    import distlab as dl
    variants = sys.argv[1].split(",")
    rounds = int(sys.argv[2])
    outp = sys.argv[3]
    lab = dl.Lab(workers=2)
    profs = {}
    for name, opts in [("mlp", {}), ("convnet", {}), ("transformer_lm", dict(vocab_size=1024, d_model=64, layers=2, heads=4, seq_len=32)), ("wide_deep", {})]:
        profs[name] = dl.profile(dl.zoo.get(name, **opts), batch_size=16)
    out = []
    try:
        for rnd in range(rounds):
            order = variants if rnd % 2 == 0 else variants[::-1]
            for v in order:
                apply(v)
                t0 = time.time()
                with warnings.catch_warnings(record=True) as ws:
                    warnings.simplefilter("always")
                    cm = lab.calibrate(cache=False, progress=False)
                p = cm.params
                scal = {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if isinstance(getattr(p, f.name), (int, float))}
                scal["allreduce_intra_4MiB_ms"] = 1e3 * (p.alpha_beta["allreduce/intra"][0] + (4 << 20) * p.alpha_beta["allreduce/intra"][1])
                rep = {s["stage"]: round(s["spread"], 3) for s in (cm.fingerprint.get("repeatability") or [])}
                preds = {}
                for name, prof in profs.items():
                    for w in (1, 2):
                        res = lab.resources.with_world(w)
                        for b in (["AllReduce"] if w == 1 else ["AllReduce", "PS", "Gossip"]):
                            s = dl.strategy.build(b, prof, res, batch_size=16)
                            preds[f"{name}/{b}/{w}"] = cm.predict(prof, res, s).throughput
                out.append({"variant": v, "round": rnd, "seconds": round(time.time() - t0, 1), "stages": rep,
                            "disturbed": cm.fingerprint.get("disturbed"), "params": scal, "preds": preds})
                print(v, rnd, out[-1]["seconds"], rep, "disturbed", out[-1]["disturbed"], flush=True)
                json.dump(out, open(outp, "w"), indent=1)
    finally:
        lab.close()
    for v in variants:
        mine = [o for o in out if o["variant"] == v]
        sp = {}
        for k in mine[0]["preds"]:
            vals = [o["preds"][k] for o in mine]
            sp[k] = (max(vals) - min(vals)) / statistics.median(vals)
        print(f"== {v}: median spread {statistics.median(sp.values()):.1%} max {max(sp.values()):.1%} ({max(sp, key=sp.get)}); seconds {[o['seconds'] for o in mine]}")
        for k in mine[0]["params"]:
            vals = [o["params"][k] for o in mine]
            if max(vals) != min(vals) and not isinstance(vals[0], bool):
                print(f"   {k:26s} {['%.4g' % x for x in vals]}")
