"""dl.profile's step time is a plain step at batch_size, and its compute fit recovers how a step grows with
the batch."""

import statistics
import time

import pytest
import torch
from torch import nn

import distlab as dl
from distlab import ModelProfile
from distlab.costmodel.compile import compile_strategy
from distlab.errors import ProfileError
from distlab.profiling.torch_profiler import _fit_line
from distlab.strategy.types import BatchConfig, RankSpec, Strategy, Sync, VariablePlan


class GRULM(nn.Module):
    """Many small ops per step (a recurrence over 32 tokens): per-op metering costs more than the step."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(1000, 64)
        self.gru = nn.GRU(64, 128, batch_first=True)
        self.out = nn.Linear(128, 1000)

    def forward(self, x):
        h, _ = self.gru(self.emb(x))
        return self.out(h)


def bn_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )


def plain_step_time(model, x, steps=9):
    """Median of a plain training loop's forward + backward (ones gradient) + zeroed gradients."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = model(x)
        out.backward(torch.ones_like(out))
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@pytest.mark.parametrize(
    "make, sample",
    [
        pytest.param(  # seconds of timed steps: left to `make test`
            GRULM,
            torch.randint(0, 1000, (16, 32), generator=torch.Generator().manual_seed(0)),
            id="gru_lm",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            bn_cnn, torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0)), id="batchnorm_cnn"
        ),
    ],
)
def test_step_time_matches_a_plain_training_loop_at_the_same_batch(make, sample):
    """The quietest of three interleaved rounds on each side agree within 0.75-1.33x.

    A busy moment on the shared cores only ever adds time, to either side, in some rounds (CI once saw
    per-round ratios 1.53, 0.99, 1.59); a bias (metering inflating the step, a step at another batch)
    is in every round of the profile. So the test compares each side's fastest round: noise falls out
    of both minima, a bias stays in the profile's. A profile too fast in two rounds of three fails,
    which the earlier rule (any one round in the band) let pass. A moment that made one plain round
    fast fails the minima alone (CI: plain rounds 22.2, 22.3 and 17.1 ms against profiles of 22.7-23.4
    ms, 1.33), so the median of the per-round ratios (1.05 there) may pass it instead: a bias is in
    every round, so it moves both figures out of the band; noise in some rounds moves one."""
    model = make().train()
    plain_step_time(model, sample, steps=3)  # warm the process up before either is timed
    profiled, plain = [], []
    for _ in range(3):  # interleaved, so drift on a shared machine hits both alike
        prof = dl.profile(model, sample_input=sample, batch_size=16)
        profiled.append(prof.step_time)
        plain.append(plain_step_time(model, sample))
    assert prof.meta["time_batch"] == 16 and prof.meta["step_repeats"] >= 3
    ratio = min(profiled) / min(plain)
    per_round = statistics.median(a / b for a, b in zip(profiled, plain))
    assert 0.75 <= ratio <= 1.33 or 0.75 <= per_round <= 1.33, (
        f"profile / plain loop, fastest rounds: {ratio:.2f}, median of rounds {per_round:.2f} "
        f"({profiled}, {plain})"
    )
    layers = prof.to_frame()
    assert layers.time_fwd.sum() + layers.time_bwd.sum() == pytest.approx(prof.step_time, rel=1e-6)


class Sleeper(nn.Module):
    """A step whose forward sleeps ``alpha + beta * batch`` seconds."""

    def __init__(self, alpha, beta):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.alpha, self.beta = alpha, beta

    def forward(self, x):
        time.sleep(self.alpha + self.beta * x.shape[0])
        return self.fc(x)


def test_compute_fit_from_two_batches_recovers_a_known_fixed_and_per_sample_cost():
    alpha, beta = 0.010, 0.001
    prof = dl.profile(Sleeper(alpha, beta), torch.randn(4, 4), batch_size=32)
    fit = prof.meta["step_fit"]
    assert fit["batches"] == [32, 16] and len(fit["seconds"]) == 2
    assert fit["beta"] == pytest.approx(beta, rel=0.2)
    assert fit["alpha"] == pytest.approx(alpha, rel=0.3)
    assert prof.compute_time_at(32) == prof.compute_time == prof.step_time
    # a quarter of the batch costs far more than a quarter of the step: the fixed cost stays
    assert prof.compute_time_at(8) == pytest.approx(alpha + beta * 8, rel=0.2)
    assert prof.compute_time_at(64) == pytest.approx(alpha + beta * 64, rel=0.2)
    back = ModelProfile.from_json(prof.to_json())
    assert back == prof and back.meta["step_fit"] == fit
    assert back.compute_time_at(8) == prof.compute_time_at(8)


def test_batchnorm_models_never_step_at_batch_one():
    # BatchNorm1d on [batch, channels] fails on one sample: any pass at batch 1 would raise
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
    prof = dl.profile(model, batch_size=2, micro_batch=1, repeats=1, warmup=0)
    assert prof.meta["step_fit"]["batches"] == [2, 4] and prof.meta["meter_batch"] == 2
    prof = dl.profile(model, batch_size=3, repeats=1, warmup=0)
    assert prof.meta["step_fit"]["batches"] == [3, 2]


def test_fit_keeps_both_costs_non_negative():
    def fit(*args):
        got = _fit_line(*args)
        return got["alpha"], got["beta"], got["batches"], got["seconds"]

    assert fit(16, 0.020, 8, 0.012) == (pytest.approx(0.004), pytest.approx(0.001), [16, 8], [0.020, 0.012])
    # the small batch measured relatively slower than no fixed cost allows: all per-sample
    assert fit(16, 0.020, 8, 0.009)[:2] == (0.0, pytest.approx(0.020 / 16))
    # the larger batch measured faster: all fixed
    assert fit(16, 0.020, 8, 0.021)[:2] == (0.020, 0.0)
    assert fit(1, 0.010, 2, 0.015)[:2] == (pytest.approx(0.005), pytest.approx(0.005))


def test_compute_time_at_scales_linearly_without_a_fit():
    prof = ModelProfile.from_variables([("w", (10, 10))], batch_size=32, time_per_sample=0.001)
    assert "step_fit" not in prof.meta
    assert prof.compute_time_at(32) == prof.compute_time == pytest.approx(0.032)
    assert prof.compute_time_at(8) == pytest.approx(0.008)
    assert ModelProfile.from_json(prof.to_json()).compute_time_at(64) == pytest.approx(0.064)
    with pytest.raises(ProfileError, match="batch must be a positive number"):
        prof.compute_time_at(0)


def test_the_cost_model_computes_a_replica_batch_from_the_fit():
    fit = {"alpha": 0.010, "beta": 0.001, "batches": [32, 16], "seconds": [0.042, 0.026]}
    linear = ModelProfile.from_variables([("w", (10, 10))], batch_size=32, time_per_sample=0.042 / 32)
    fitted = ModelProfile(
        linear.variables, linear.layers, batch_size=32, step_time=0.042, meta={"step_fit": fit}
    )
    ranks = (RankSpec(0, "h0"),)
    for per_replica, expect in ((32, 0.042), (8, 0.018)):
        s = Strategy(
            (VariablePlan("w", Sync("allreduce")),), ranks, batch=BatchConfig(per_replica, 1), builder="t"
        )
        c = compile_strategy(fitted, s)
        assert c.fwd + c.bwd == pytest.approx(expect)
        assert c.fwd / c.bwd == pytest.approx(0.5)  # from_variables splits a step 1 : 2
        assert compile_strategy(linear, s).fwd + compile_strategy(linear, s).bwd == pytest.approx(
            0.042 * per_replica / 32
        )


def test_a_first_profile_in_a_fresh_process_does_not_import_dynamo():
    """A kernel's first ``dl.profile`` imported torch._dynamo (1-2.5 s here) through fake tensors and
    torch's dynamo.disable of a dispatch mode; a batch metered at its full size needs neither."""
    import subprocess
    import sys

    code = (
        "import sys, torch, distlab as dl\n"
        "m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))\n"
        "p = dl.profile(m, torch.randn(4, 64), batch_size=16)\n"
        "print(p.meta['flops_method'], p.flops, 'torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    method, flops, dynamo = out.stdout.split()[-3:]
    # 2 FLOPs per multiply-add; backward 2x forward, but 1x for the first layer (its input needs no
    # gradient): 2*16*64*32 * 2 + 2*16*32*10 * 3, as fake tensors count it
    assert dynamo == "False" and method == "batch_size" and float(flops) == 161792, out.stdout
