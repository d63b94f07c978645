"""The noise scale measured before a run, and the goodput forecast the picker shows from it."""

from __future__ import annotations

import pytest
import torch

import distlab as dl
from distlab.adaptive.quadratic import Quadratic, noisy_quadratic, quadratic_loss
from distlab.errors import DistlabError
from distlab.runs.adaptive import adaptive_forecast
from distlab.runtime.noise_probe import measure_noise_scale


def noisy_model(d: int = 64, s2: float = 1.0, dist: float = 1.0, n: int = 8192):
    w, data = noisy_quadratic(d, s2, n, dist=dist)
    return Quadratic(w), data


@pytest.mark.parametrize("d, s2, dist", [(64, 1.0, 1.0), (16, 4.0, 0.25)])  # phi = 64 and 256
def test_the_measured_noise_scale_is_the_known_one_and_the_model_is_unchanged(d, s2, dist):
    model, data = noisy_model(d, s2, dist)
    before = model.w.detach().clone()
    m = measure_noise_scale(model, data, quadratic_loss, batch_size=16, steps=100)
    assert m.noise_scale == pytest.approx(d * s2 / dist, rel=0.15)
    assert m.var == pytest.approx(d * s2, rel=0.15)  # per-sample tr(Sigma)
    assert torch.equal(model.w.detach(), before) and model.w.grad is None
    assert "noise scale" in str(m) and m.steps == 100 and m.micro == 4


def test_a_batchnorm_model_keeps_its_running_statistics():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 3))
    x, y = torch.randn(256, 8), torch.randint(0, 3, (256,))
    stats = model[1].running_mean.clone()
    m = measure_noise_scale(model, (x, y), batch_size=8, steps=5)
    assert m.noise_scale > 0 and torch.equal(model[1].running_mean, stats)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"steps": 1.5}, "steps"),
        ({"micro": 1}, "micro"),
        ({"batch_size": 4096}, "fewer than one step"),
        ({"data": None}, "data is required"),
        ({"model": "net"}, "model must be a torch nn.Module"),
    ],
)
def test_bad_input_is_one_error_naming_the_field(kwargs, field):
    model, data = noisy_model(n=512)
    args = {"model": model, "data": data, "loss": quadratic_loss, **kwargs}
    with pytest.raises(DistlabError, match=field):
        measure_noise_scale(args.pop("model"), args.pop("data"), args.pop("loss"), **args)


@pytest.fixture(scope="module")
def adaptive_plan():
    prof = dl.ModelProfile.from_variables(
        [("w", (512, 512)), ("b", (512,))], time_per_sample=2e-5, batch_size=8
    )
    res = dl.ResourceSpec.local(workers=2)
    return prof, res, dl.strategy.build("AdaptiveBatch", prof, res)


def test_the_forecast_trades_throughput_for_efficiency_as_the_noise_scale_grows(adaptive_plan):
    prof, res, st = adaptive_plan
    cm = dl.CostModel.default()
    low = adaptive_forecast(cm, prof, res, st, 0.01)
    high = adaptive_forecast(cm, prof, res, st, 1e6)
    # a noise scale near 0: every extra sample is wasted, so the smallest batch (8 per replica, no
    # accumulation); a huge one: every sample counts, so the configuration of highest throughput
    assert (low.per_replica, low.accumulation, low.global_batch) == (8, 1, 16)
    assert high.global_batch >= low.global_batch and high.efficiency == pytest.approx(1.0, abs=1e-3)
    for f in (low, high):
        assert f.throughput == pytest.approx(f.global_batch / f.step_time)
        assert f.efficiency == pytest.approx(min(1.0, (f.noise_scale + 8) / (f.noise_scale + f.global_batch)))
        assert f.goodput == pytest.approx(f.throughput * f.efficiency)
    fixed = dl.strategy.build("AllReduce", prof, res)
    assert adaptive_forecast(cm, prof, res, fixed, 64.0) is None
