import sys, statistics
import dask
dask.config.set({"distributed.worker.daemon": False})
import distlab as dl
from distlab.bench import own_loop as ol
from distlab.bench.ddp import ddp_only_body

if __name__ == "__main__":
    spec = {"options": {"in_features": 64, "width": 256, "depth": 2}, "steps": 1000, "warmup": 50}
    batch, workers = 64, 2
    lab = dl.Lab(workers=workers)
    model, dataset = ol.build_case(spec["options"], batch, workers, spec["steps"])
    ol.own_throughput(lab, model, dataset, batch, 30, 10)
    res = {"ddp": [], "ddp_dask": [], "own": []}
    for i in range(int(sys.argv[1])):
        res["ddp"].append(ol.ddp_throughput(workers, spec["options"], batch, spec["steps"], spec["warmup"]))
        out = lab.run_ranks(ddp_only_body, "mlp", spec["options"], batch, spec["steps"], spec["warmup"])
        res["ddp_dask"].append(out[0]["samples_per_s"])
        res["own"].append(ol.own_throughput(lab, model, dataset, batch, spec["steps"], spec["warmup"])[0])
        print(i, {k: round(v[-1]) for k, v in res.items()}, flush=True)
    print("medians", {k: statistics.median(v) for k, v in res.items()})
    for k in ("ddp_dask", "own"):
        print(k, "/ddp per round", [round(a / b, 3) for a, b in zip(res[k], res["ddp"])])
    lab.close()
