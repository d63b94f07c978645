"""How well a step model fitted at <= 4 replicas predicts larger ones (Pollux artifact placements.csv).

For each of the six applications: fit on the rows with num_replicas <= 4 (every placement and
local batch measured there), predict step_time of every row with more replicas, report the mean
absolute percentage error. Two models: distlab's (distlab.costmodel.fit.fit_measurements) and
Pollux's own (the artifact's fit_perf_params, as ported in distlab.sched.artifact_goodput).
Usage: python datasets/measurements/sched-extrapolation-2026-11-28.py; writes the .json beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).with_suffix(".json")


def main() -> None:
    from distlab.costmodel.fit import fit_measurements, predict_measurements
    from distlab.sched import artifact
    from distlab.sched.artifact_goodput import (
        fit_perf_params,
        predict_accum_time,
        predict_log_optim_time,
        predict_network_time,
    )

    rows = []
    for name in sorted(artifact.SETTINGS):
        df = artifact.application(name).placements
        train, test = df[df.num_replicas <= 4], df[df.num_replicas > 4]
        y = test.step_time.to_numpy()
        _, theta, _ = fit_measurements(train[["num_nodes", "num_replicas", "local_bsz", "step_time"]])
        ours = predict_measurements(theta, test[["num_nodes", "num_replicas", "local_bsz"]])
        cols = [train[c].to_numpy() for c in ("num_nodes", "num_replicas", "local_bsz")]
        perf = fit_perf_params(
            *cols, (train.step_time - train.sync_time).to_numpy(), train.step_time.to_numpy()
        )
        n, r, b = (test[c].to_numpy() for c in ("num_nodes", "num_replicas", "local_bsz"))
        acc = predict_accum_time(perf, b)
        pollux = np.exp(predict_log_optim_time(perf, acc, predict_network_time(perf, n, r)))
        rows.append(
            {
                "application": name,
                "train_rows": len(train),
                "test_rows": len(test),
                "test_replicas": sorted({int(v) for v in test.num_replicas}),
                "distlab_mape": float(np.mean(np.abs(ours / y - 1))),
                "pollux_mape": float(np.mean(np.abs(pollux / y - 1))),
            }
        )
    summary = {
        "what": "fit at num_replicas <= 4, predict step_time at > 4, per application of the Pollux artifact",
        "target": "distlab's step model within 10% MAPE on all six",
        "distlab_mean_mape": float(np.mean([r["distlab_mape"] for r in rows])),
        "pollux_mean_mape": float(np.mean([r["pollux_mape"] for r in rows])),
        "met": all(r["distlab_mape"] <= 0.10 for r in rows),
        "rows": rows,
    }
    OUT.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
