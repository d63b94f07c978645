"""Online refit (Pollux refits while jobs run): each finished run refits the Lab's cost model, and lab.runs
shows both predictions."""

from __future__ import annotations

import sys
import warnings

import cloudpickle
import pytest
import torch
from launch_helpers import Blobs

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def lab():
    """A Lab of its own, not the session's: each run refits on every run so far, and only this
    module's runs may make a trend."""
    from distlab.lab import Lab

    with Lab(workers=2, timeout=20) as lab:
        yield lab


class Wider(torch.nn.Module):
    """A small MLP of a few milliseconds a step."""

    def __init__(self, hidden: int = 768) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 4),
        )

    def forward(self, x):
        return self.net(x)


def _skewed(lab, models, data):
    """The Lab's model with these models' measured steps 12x too slow, as a calibration taken
    while other programs held the cores would measure them."""
    lab.cost_model = None
    for m in models:
        lab.measure_model(m, data=data, batch_size=32, progress=False)
    cm = lab.cost_model
    rows = [{**r, "seconds": 12 * r["seconds"]} for r in cm.compute.to_rows()]
    return cm.without_compute({r["key"] for r in rows}).with_compute(rows)


def test_runs_that_keep_landing_far_from_their_predictions_are_named_once(clean_lab, tmp_path):
    from distlab.runs.run import PredictionDriftWarning

    clean_lab.cache_dir = tmp_path
    data = Blobs()
    models = [Wider(640), Wider(896)]
    clean_lab.cost_model = _skewed(clean_lab, models, data)
    assert clean_lab.history == []  # first in its module: only this test's runs make a trend
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        clean_lab.launch(
            models[0], strategy="AllReduce", data=data, steps=30, batch_size=32, elastic=False, block=True
        )
        assert not [
            w for w in caught if issubclass(w.category, PredictionDriftWarning)
        ]  # one run is not a trend
        clean_lab.launch(
            models[1], strategy="AllReduce", data=data, steps=30, batch_size=32, elastic=False, block=True
        )
    notes = [str(w.message) for w in caught if issubclass(w.category, PredictionDriftWarning)]
    assert len(notes) == 1 and "the last 2 runs measured" in notes[0] and "refitted" in notes[0]
    assert "lab.calibrate(cache=False)" in notes[0] and "\n" not in notes[0]
    ratios = clean_lab.runs.eval("measured_throughput / predicted_throughput").iloc[-2:]
    assert (ratios > 1.3).all()  # both ran much faster than the skewed calibration said


def test_a_run_refits_the_model_and_the_next_prediction_is_closer(clean_lab, tmp_path):
    """A calibration 12x off (``_skewed``) predicts the first run far from what it measures; the refit
    on that run brings the second prediction within the runs' own noise (25%), whatever the skew."""
    from distlab.costmodel import CostModel

    clean_lab.cache_dir = tmp_path
    model, data = Wider(), Blobs()
    clean_lab.cost_model = _skewed(clean_lab, [model], data)
    # 150 steps: a median step steady enough that the second run's error is the refit's, not the noise's
    first = clean_lab.launch(
        model, strategy="AllReduce", data=data, steps=150, batch_size=32, elastic=False, block=True
    )
    runs = clean_lab.runs
    row = runs.iloc[0]
    assert row["model_key"] and row["measured_step"] > 0 and row["predicted_compute"] > 0
    assert clean_lab.cost_model.refits[row["model_key"]].runs == 1  # refitted on the finished run
    assert row["refitted_throughput"] == row["refitted_throughput"]  # predicted again after the refit
    assert CostModel.default().refit(runs).refits  # the public, pure refit takes lab.runs as it is

    second = clean_lab.launch(
        model, strategy="AllReduce", data=data, steps=150, batch_size=32, elastic=False, block=True
    )
    err = [abs(r.predicted_throughput / r.throughput - 1) for r in (first, second)]
    # The skew only has to show in the first run (err[0] > 0.4); the refit's own claim is absolute, so it
    # does not loosen with a larger skew: the second prediction comes from the first run's measured steps
    # and lands within the noise between two 150-step runs on shared cores (0.06-0.07 measured with the
    # 12x skew; 0.24 was seen once at 60 steps, ccc59d0), far from err[0] (0.68-0.69).
    assert err[0] > 0.4, err  # the skewed calibration's error is visible before the refit
    assert err[1] < 0.25, err  # after it, the prediction for the model is close
