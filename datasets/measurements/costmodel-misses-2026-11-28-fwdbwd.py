"""A run's forward + backward (trace spans) against the model's local step measured on the same
workers, alternated: where the measured-step path's too-fast predictions come from."""

import json
import os
import statistics
import sys
import tempfile

if __name__ == "__main__":
    import dask.config

    dask.config.set({"distributed.worker.daemon": False})
    import distlab as dl
    from distlab import heldout
    from distlab.costmodel.compute import model_key
    from distlab.runs.validate import variables_profile

    lab = dl.Lab(2)
    out = []
    for name in ("resnet_bn",):
        h = heldout.build(name, n=1024)
        key = model_key(variables_profile(h.model))
        import copy


        prof = dl.profile(copy.deepcopy(h.model), sample_input=h.data.tensors[0][:16], batch_size=16)
        plans = {
            "Gossip": dl.strategy.build("Gossip", prof, lab.resources, batch_size=16),
            "AllReduce": dl.strategy.build("AllReduce", prof, lab.resources, batch_size=16),
        }
        for rnd in range(3):
            lab.cache_dir = tempfile.mkdtemp()  # measured afresh each round
            cm = lab.measure_model(h.model, data=h.data, batch_size=16, progress=False)
            cores = lab.resources.cores[lab.resources.ranks[0].host]
            local = {n: cm.compute.lookup(key, n, cores, 16, lambda a, b: 1.0) for n in (1, 2)}
            for strat in ("AllReduce", "Gossip") if rnd % 2 == 0 else ("Gossip", "AllReduce"):
                n = 2
                s = plans[strat]
                run = lab.launch(h.model, strategy=s, data=h.data, steps=30, batch_size=16, trace=True)
                run.wait()
                ev = run.trace_events
                per = {}
                for e in ev:
                    if e["cat"] in ("forward", "backward") and e.get("rank", 0) == 0 and e["step"] >= 5:
                        per.setdefault(e["step"], 0.0)
                        per[e["step"]] += e["end"] - e["start"]
                fb = statistics.median(per.values()) if per else float("nan")
                m = run.metrics
                st = float(m[(m["rank"] == 0) & (m["step"] >= 5)]["step_time"].median())
                row = dict(
                    model=name,
                    round=rnd,
                    config=strat,
                    local_step=local[n],
                    run_fwd_bwd=fb,
                    run_step=st,
                    ratio=fb / local[n],
                    load=os.getloadavg()[0],
                )
                print(row, flush=True)
                out.append(row)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    lab.close()
