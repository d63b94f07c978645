"""Issue 57's known misses on diagnostic models: fresh calibrations' predictions beside interleaved runs.

Usage (one host, the embedded 2-worker Lab)::

    python datasets/measurements/costmodel-misses-2026-11-28.py OUT.json [--calibrations 3]
        [--rounds 5] [--steps 60] [--no-runs]

For each of ``--calibrations`` fresh calibrations (``lab.calibrate(cache=False)``, a fresh cache
folder each time) it predicts every configuration (AllReduce, PS, Gossip on 2 ranks, one process)
of three diagnostic models (``distlab.heldout``'s BatchNorm ResNet and BERT, ``distlab.holdout``'s
DLRM mixture) by both paths (the profile; the step measured on the workers), with the launch's
default optimizer (Adam), and records the load average beside each calibration. Then, unless
``--no-runs``, every configuration runs ``--rounds`` interleaved rounds of ``--steps`` steps. The
cost model's code is whatever ``distlab`` imports: run it once on the code before a change (with
``--no-runs`` or not) and once after, and score both files' predictions against the same runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from pathlib import Path

MODELS = (("heldout", "resnet_bn"), ("heldout", "bert_cls"), ("holdout", "dlrm_mix"))
BUILDERS = ("AllReduce", "PS", "Gossip", "1 process")
BATCH = 16


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--calibrations", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--no-runs", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    import dask.config

    dask.config.set({"distributed.worker.daemon": False})
    import distlab as dl
    from distlab import heldout, holdout
    from distlab.bench.rounds import interleaved
    from distlab.notebook.ranking import single_process

    sets = {"heldout": heldout, "holdout": holdout}
    held = {name: sets[s].build(name, n=2048) for s, name in MODELS}
    lab = dl.Lab(2)
    res = lab.resources
    profiles = {
        n: dl.profile(copy.deepcopy(h.model), sample_input=h.data.tensors[0][:BATCH], batch_size=BATCH)
        for n, h in held.items()
    }
    configs = []
    for name, prof in profiles.items():
        for b in BUILDERS:
            one = b == "1 process"
            s = single_process(prof, res) if one else dl.strategy.build(b, prof, res, batch_size=BATCH)
            configs.append(
                {
                    "model": name,
                    "builder": b,
                    "world": s.world,
                    "strategy": s,
                    "resources": res.with_world(1) if one else res,
                }
            )
    calibrations = []
    for k in range(a.calibrations):
        lab.cache_dir = Path(tempfile.mkdtemp(prefix="distlab-misses-"))
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        cm = lab.calibrate(cache=False, progress=False)
        secs = time.perf_counter() - t0
        load1 = os.getloadavg()
        preds = []
        for name, h in held.items():
            mcm = lab.measure_model(h.model, data=h.data, batch_size=BATCH, progress=False).without_refit()
            for c in configs:
                if c["model"] != name:
                    continue
                pp = cm.predict(profiles[name], c["resources"], c["strategy"])
                pm = mcm.predict(profiles[name], c["resources"], c["strategy"])
                preds.append(
                    {
                        "profile": pp.throughput,
                        "measured_step": pm.throughput,
                        "measured_step_breakdown": {**pm.breakdown, **pm.detail},
                    }
                )
        p = cm.params
        calibrations.append(
            {
                "seconds": secs,
                "loadavg_before": load0,
                "loadavg_after": load1,
                "disturbed": bool(cm.fingerprint.get("disturbed")),
                "repeatability": cm.fingerprint.get("repeatability"),
                "params": {
                    f: getattr(p, f)
                    for f in (
                        "contention",
                        "compute_scale",
                        "comm_scale",
                        "alpha_scale",
                        "thread_efficiency",
                        "hook_overhead",
                        "runtime_overhead",
                    )
                }
                | {f: getattr(p, f) for f in ("overlap_loss", "adam_tensor", "sgd_tensor") if hasattr(p, f)},
                "predictions": preds,
            }
        )
        cm.save(Path(a.out).with_suffix(f".calibration-{k + 1}.json"))
        print(f"calibration {k + 1}: {secs:.0f} s, load {load0[0]:.1f}->{load1[0]:.1f}", flush=True)
        _write(a.out, configs, calibrations, {})
    runs: dict[int, list[float]] = {i: [] for i in range(len(configs))}
    loads = []
    if not a.no_runs:
        for _, i in interleaved(len(configs), a.rounds):
            c, h = configs[i], held[configs[i]["model"]]
            run = lab.launch(h.model, strategy=c["strategy"], data=h.data, steps=a.steps, batch_size=BATCH)
            run.wait()
            assert run.status == "finished", run.error
            runs[i].append(run.throughput)
            loads.append(os.getloadavg()[0])
            _write(a.out, configs, calibrations, runs, loads)
    lab.close()


def _write(out, configs, calibrations, runs, loads=()):
    rows = [
        {k: v for k, v in c.items() if k not in ("strategy", "resources")} | {"runs": runs.get(i, [])}
        for i, c in enumerate(configs)
    ]
    Path(out).write_text(
        json.dumps(
            {"rows": rows, "calibrations": calibrations, "run_loadavg": list(loads), "written": time.time()},
            indent=1,
            default=str,
        )
    )


if __name__ == "__main__":
    main()
