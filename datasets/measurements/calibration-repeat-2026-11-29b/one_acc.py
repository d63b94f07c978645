import sys, time, json, warnings
if __name__ == "__main__":
    import distlab as dl
    lab = dl.Lab(workers=2)
    try:
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            cm = lab.calibrate(cache=False)
        out = {}
        for name in ["mlp", "convnet", "wide_deep"]:
            model = dl.zoo.get(name, seed=0)
            prof = dl.profile(model, batch_size=16)
            for w, b in [(1, "AllReduce"), (2, "AllReduce"), (2, "PS")]:
                res = lab.resources.with_world(w)
                s = dl.strategy.build(b, prof, res, batch_size=16)
                pred = cm.predict(prof, res, s).throughput
                with warnings.catch_warnings(record=True):
                    warnings.simplefilter("always")
                    run = lab.launch(model, strategy=s, steps=80, workers=w)
                    run.wait(300, progress=False)
                out[f"{name}/{b}/{w}"] = {"pred": pred, "meas": run.throughput}
        with open(sys.argv[1], "a") as f:
            f.write(json.dumps({"variant": sys.argv[2], "res": out}) + "\n")
    finally:
        lab.close()
