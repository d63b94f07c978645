"""The typical error a prediction states is the one the held-out benchmark measured, not a guess."""

from __future__ import annotations

import json
import re
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


def test_the_readme_quotes_each_basis_error_as_the_prediction_states_it():
    readme = (CARD.parents[1] / "README.md").read_text()
    quoted = re.search(r"(\d+)% from a profile, (\d+)% from a measured step", " ".join(readme.split()))
    assert quoted, (
        "README.md no longer quotes pred.uncertainty as 'N% from a profile, M% from a measured step'"
    )
    assert int(quoted[1]) == round(100 * BASIS_ERROR[PROFILE])
    assert int(quoted[2]) == round(100 * BASIS_ERROR[MEASURED_STEP])
