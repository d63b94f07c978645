import sys, statistics
import dask
dask.config.set({"distributed.worker.daemon": False})
import distlab as dl
from distlab.bench import own_loop as ol

def set_emit(v):
    import distlab.runs.train as t
    t.EMIT_INTERVAL = v

if __name__ == "__main__":
    spec = {"options": {"in_features": 64, "width": 256, "depth": 2}, "steps": 1000, "warmup": 50}
    batch, workers = 64, 2
    lab = dl.Lab(workers=workers)
    model, dataset = ol.build_case(spec["options"], batch, workers, spec["steps"])
    import distlab.runs.train as t
    default = t.EMIT_INTERVAL
    ol.own_throughput(lab, model, dataset, batch, 30, 10)
    res = {"default": [], "slow_emit": [], "noelastic": []}
    for i in range(int(sys.argv[1])):
        for k in ("default", "slow_emit", "noelastic"):
            lab.client.run(set_emit, 10.0 if k == "slow_emit" else default)
            res[k].append(ol.own_throughput(lab, model, dataset, batch, spec["steps"], spec["warmup"], elastic=(k != "noelastic"))[0])
        print(i, {k: round(v[-1]) for k, v in res.items()}, flush=True)
    print("medians", {k: statistics.median(v) for k, v in res.items()})
    lab.close()
