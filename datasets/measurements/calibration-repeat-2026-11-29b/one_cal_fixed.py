import sys, time, json, warnings, dataclasses
if __name__ == "__main__":
    import distlab as dl
    lab = dl.Lab(workers=2)
    try:
        import pickle
        profs = pickle.load(open("/tmp/s/profs.pkl", "rb"))  # profiled once (make_profs.py): only the calibration varies
        t0 = time.time()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            cm = lab.calibrate(cache=False, progress=False)
        secs = time.time() - t0
        p = cm.params
        scal = {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if isinstance(getattr(p, f.name), (int, float)) and not isinstance(getattr(p, f.name), bool)}
        scal["allreduce_intra_4MiB_ms"] = 1e3 * (p.alpha_beta["allreduce/intra"][0] + (4 << 20) * p.alpha_beta["allreduce/intra"][1])
        preds = {}
        for name, prof in profs.items():
            for w in (1, 2):
                res = lab.resources.with_world(w)
                for b in (["AllReduce"] if w == 1 else ["AllReduce", "PS", "Gossip"]):
                    s = dl.strategy.build(b, prof, res, batch_size=16)
                    preds[f"{name}/{b}/{w}"] = cm.predict(prof, res, s).throughput
        fp = cm.fingerprint
        scal["microbench_contention"] = fp.get("flops_per_s_alone", 0) / fp.get("flops_per_s_busy", 1) - 1
        out = {"seconds": round(secs, 1), "disturbed": cm.fingerprint.get("disturbed"),
               "stages": {s["stage"]: round(s["spread"], 3) for s in (cm.fingerprint.get("repeatability") or [])},
               "params": scal, "preds": preds}
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps({"variant": sys.argv[2], **out}) + "\n")
    finally:
        lab.close()
