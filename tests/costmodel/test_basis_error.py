"""The typical error a prediction states is the one the held-out benchmark measured, not a guess."""

from __future__ import annotations

import json
from pathlib import Path

from distlab.costmodel.prediction import BASIS_ERROR, MEASURED_STEP, PROFILE

CARD = Path(__file__).resolve().parents[2] / "datasets" / "measurements"


def test_each_basis_states_the_mean_error_the_prediction_paths_benchmark_measured_on_held_out_models():
    (latest,) = sorted(CARD.glob("prediction-paths-*.json"))[-1:]
    summary = json.loads(latest.read_text())["summary"]
    assert summary["model_set"] == "holdout"  # scored on the held-out set, never the diagnostic one
    assert BASIS_ERROR[PROFILE] == round(summary["profile_mape"], 2)
    assert BASIS_ERROR[MEASURED_STEP] == round(summary["measured_step_mape"], 2)
    assert latest.stem.removeprefix("prediction-paths-") in (CARD / "prediction-paths.md").read_text()
