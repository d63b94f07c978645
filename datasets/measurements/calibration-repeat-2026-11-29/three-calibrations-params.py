"""Three fresh default calibrations: the fitted scalar parameters of each, and the one-rank
predictions' parts, to see which parameter carries the world-1 spread."""
import sys, json, warnings
if __name__ == "__main__":
    import dataclasses
    import distlab as dl
    lab = dl.Lab(workers=2)
    profs = {n: dl.profile(dl.zoo.get(n, **o), batch_size=16) for n, o in [("mlp", {}), ("convnet", {}), ("wide_deep", {})]}
    rows = []
    try:
        for i in range(3):
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                cm = lab.calibrate(cache=False, progress=False)
            p = cm.params
            scal = {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if isinstance(getattr(p, f.name), (int, float))}
            res1 = lab.resources.with_world(1)
            parts = {}
            for n, prof in profs.items():
                s = dl.strategy.build("AllReduce", prof, res1, batch_size=16)
                pr = cm.predict(prof, res1, s)
                parts[n] = {"step_ms": pr.step_time * 1e3, **{k: v * 1e3 for k, v in (pr.breakdown or {}).items() if isinstance(v, (int, float))}}
            rows.append({"params": scal, "parts": parts})
            print(i, flush=True)
    finally:
        lab.close()
    keys = rows[0]["params"]
    for k in keys:
        v = [r["params"][k] for r in rows]
        if max(v) != min(v):
            print(f"{k:24s} {['%.4g' % x for x in v]}")
    for n in profs:
        print("==", n)
        for k in rows[0]["parts"][n]:
            print(f"   {k:24s} {['%.3f' % r['parts'][n].get(k, float('nan')) for r in rows]}")
    json.dump({"calibrations": rows}, open("three-calibrations-params.json", "w"), indent=1)
