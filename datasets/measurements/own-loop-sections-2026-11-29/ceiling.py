import sys, time, statistics, json
import dask
dask.config.set({"distributed.worker.daemon": False})
import distlab as dl
from distlab.bench import own_loop as ol

class Profiled(ol.PlainLoop):
    def __call__(self, ctx):
        import cProfile, pstats, io
        pr = cProfile.Profile()
        pr.enable()
        try:
            return super().__call__(ctx)
        finally:
            pr.disable()
            if ctx.rank == 0:
                pr.dump_stats("/tmp/ol/own.prof")

if __name__ == "__main__":
    spec = {"options": {"in_features": 64, "width": 256, "depth": 2}, "steps": 1000, "warmup": 50}
    batch, workers = 64, 2
    lab = dl.Lab(workers=workers)
    model, dataset = ol.build_case(spec["options"], batch, workers, spec["steps"])
    ol.own_throughput(lab, model, dataset, batch, 30, 10)
    res = {"own": [], "ddp": [], "ddp2": [], "launch": []}
    for i in range(int(sys.argv[1])):
        res["ddp"].append(ol.ddp_throughput(workers, spec["options"], batch, spec["steps"], spec["warmup"]))
        res["own"].append(ol.own_throughput(lab, model, dataset, batch, spec["steps"], spec["warmup"])[0])
        res["ddp2"].append(ol.ddp_throughput(workers, spec["options"], batch, spec["steps"], spec["warmup"]))
        res["launch"].append(ol.launch_throughput(lab, model, dataset, batch, spec["steps"], spec["warmup"])[0])
        print(i, {k: round(v[-1]) for k, v in res.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    print("medians", med)
    print("own/ddp per round", [a / b for a, b in zip(res["own"], res["ddp"])])
    print("ddp2/ddp per round", [a / b for a, b in zip(res["ddp2"], res["ddp"])])
    print("launch/ddp per round", [a / b for a, b in zip(res["launch"], res["ddp"])])
    if len(sys.argv) > 2:
        run = lab.run(Profiled(model, dataset, batch, spec["steps"]), strategy="AllReduce")
        run.wait(600, progress=False)
    lab.close()
