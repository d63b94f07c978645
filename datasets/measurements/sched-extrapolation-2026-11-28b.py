"""How well a step model fitted at <= 4 replicas predicts larger ones (Pollux artifact placements.csv), b.

As sched-extrapolation-2026-11-28.py, with distlab's step model fitting the inter-host all-reduce
bandwidth per host count where the rows identify it (distlab.costmodel.fit); the one-class model
of the first file is reported beside it (``by_hosts=False``), with Pollux's own model. The rule was
chosen on the training rows alone: fit at <= 3 replicas, predict the 4-replica rows (``nested``).
Usage: python datasets/measurements/sched-extrapolation-2026-11-28b.py; writes the .json beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).with_suffix(".json")
COLS = ["num_nodes", "num_replicas", "local_bsz"]


def _mape(train, test, by_hosts):  # noqa: ANN001, ANN202
    from distlab.costmodel.fit import fit_measurements, predict_measurements

    _, theta, _ = fit_measurements(train[[*COLS, "step_time"]], by_hosts=by_hosts)
    return float(np.mean(np.abs(predict_measurements(theta, test[COLS]) / test.step_time.to_numpy() - 1)))


def _pollux_mape(train, test):  # noqa: ANN001, ANN202
    from distlab.sched.artifact_goodput import (
        fit_perf_params,
        predict_accum_time,
        predict_log_optim_time,
        predict_network_time,
    )

    cols = [train[c].to_numpy() for c in COLS]
    perf = fit_perf_params(*cols, (train.step_time - train.sync_time).to_numpy(), train.step_time.to_numpy())
    n, r, b = (test[c].to_numpy() for c in COLS)
    pred = np.exp(predict_log_optim_time(perf, predict_accum_time(perf, b), predict_network_time(perf, n, r)))
    return float(np.mean(np.abs(pred / test.step_time.to_numpy() - 1)))


def main() -> None:
    from distlab.sched import artifact

    rows = []
    for name in sorted(artifact.SETTINGS):
        df = artifact.application(name).placements
        train, test = df[df.num_replicas <= 4], df[df.num_replicas > 4]
        inner, held = train[train.num_replicas <= 3], train[train.num_replicas == 4]
        rows.append(
            {
                "application": name,
                "train_rows": len(train),
                "test_rows": len(test),
                "distlab_mape": _mape(train, test, None),
                "distlab_one_inter_class_mape": _mape(train, test, False),
                "pollux_mape": _pollux_mape(train, test),
                "nested_distlab_mape": _mape(inner, held, None),
                "nested_one_inter_class_mape": _mape(inner, held, False),
            }
        )
    mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0] if k.endswith("mape")}
    summary = {
        "what": "fit at num_replicas <= 4, predict step_time at > 4, per application of the Pollux artifact",
        "target": "distlab's step model within 10% MAPE on all six",
        "nested": "fit at <= 3 replicas, predict the 4-replica rows: how the fitting rule was chosen",
        "mean": mean,
        "met": all(r["distlab_mape"] <= 0.10 for r in rows),
        "rows": rows,
    }
    OUT.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
