"""Three fresh default calibrations on one Lab; each one's predictions (profile path) for zoo models
x builders at worlds 1 and 2; the spread of the predictions across the calibrations, beside each
calibration's own stage spreads."""
import sys, time, json, warnings
if __name__ == "__main__":
    import distlab as dl
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    lab = dl.Lab(workers=2)
    profs = {}
    for name, opts in [("mlp", {}), ("convnet", {}), ("transformer_lm", dict(vocab_size=1024, d_model=64, layers=2, heads=4, seq_len=32)), ("wide_deep", {})]:
        m = dl.zoo.get(name, **opts)
        profs[name] = dl.profile(m, batch_size=16)
    out = []
    try:
        for i in range(n):
            t0 = time.time()
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                cm = lab.calibrate(cache=False, progress=False)
            rep = {s["stage"]: round(s["spread"], 3) for s in (cm.fingerprint.get("repeatability") or [])}
            preds = {}
            for name, prof in profs.items():
                for w in (1, 2):
                    res = lab.resources.with_world(w)
                    for b in (["AllReduce"] if w == 1 else ["AllReduce", "PS", "Gossip"]):
                        s = dl.strategy.build(b, prof, res, batch_size=16)
                        preds[f"{name}/{b}/{w}"] = cm.predict(prof, res, s).throughput
            out.append({"seconds": round(time.time() - t0, 1), "stages": rep, "preds": preds,
                        "contention": cm.params.contention})
            print(i, out[-1]["seconds"], rep, flush=True)
    finally:
        lab.close()
    keys = list(out[0]["preds"])
    spreads = {}
    for k in keys:
        v = [o["preds"][k] for o in out]
        spreads[k] = (max(v) - min(v)) / sorted(v)[len(v) // 2]
    import statistics
    for k in keys:
        print(f"{k:32s} {[round(o['preds'][k]) for o in out]} spread {spreads[k]:.1%}")
    print("median spread", f"{statistics.median(spreads.values()):.1%}", "max", f"{max(spreads.values()):.1%}")
    json.dump({"calibrations": out, "spreads": spreads}, open(sys.argv[2] if len(sys.argv) > 2 else "three-calibrations.json", "w"), indent=1)
