"""How a shared Lab's scheduler prices a run: the cost model's speedup before it ran, its measured one
after, the strategy a run that lets the scheduler choose resumes under, and a restart's measured cost."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

import distlab as dl
from distlab.costmodel import CostModel
from distlab.errors import LaunchError
from distlab.sched.lab_pricing import (
    SWITCH_MARGIN,
    Guarded,
    GuardedChoice,
    OwnStrategySpeedup,
    ProfileTap,
    RestartPricer,
    chosen_strategy,
    measured_rows,
    run_speedup,
    switch_to,
)
from distlab.sched.restart import RELAUNCH_GUESS, estimate_relaunch
from distlab.sched.speedup import StrategySpeedup


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class PSFaster:
    """The default cost model, except that it predicts PS twice as fast on more than one replica."""

    def __init__(self) -> None:
        self.base = CostModel.default()

    def rank(self, profile, resources, plans, **kw):  # noqa: ANN001, ANN201
        df = self.base.rank(profile, resources, plans, **kw)
        ps = (df["strategy"] == "PS") & (df["world"] > 1)
        df.loc[ps, "throughput"] *= 2
        df.loc[ps, "step_time"] /= 2
        df.loc[ps, "compute"] /= 2
        return df.sort_values("throughput", ascending=False).reset_index(drop=True)


class PSAsFastAs:
    """The default cost model, except that PS is predicted ``gain`` times AllReduce's throughput."""

    def __init__(self, gain: float) -> None:
        self.base, self.gain = CostModel.default(), gain

    def rank(self, profile, resources, plans, **kw):  # noqa: ANN001, ANN201
        df = self.base.rank(profile, resources, plans, **kw)
        ar = df.loc[df["strategy"] == "AllReduce"].iloc[0]
        ps = df["strategy"] == "PS"
        df.loc[ps, "throughput"] = ar["throughput"] * self.gain
        df.loc[ps, "step_time"] = ar["step_time"] / self.gain
        return df


@pytest.fixture(scope="module")
def profile():
    return dl.profile(Net(), batch_size=16)


def _records(segments: list[tuple[int, int, float]]) -> pd.DataFrame:
    """Rank 0's step records: per (restart, world, step seconds), 20 steps of 16 samples a replica."""
    rows, samples, t = [], 0, 1000.0
    step = 0
    for restart, world, dt in segments:
        for _ in range(20):
            t += dt
            samples += 16 * world
            rows.append({"rank": 0, "step": step, "restart": restart, "world": world, "samples": samples,
                         "wall_time": t})  # fmt: skip
            step += 1
        t += 3.0  # the pause between segments
    return pd.DataFrame(rows)


def _job(metrics=None, *, chooses=False, profile=None, strategy="AllReduce", checkpoint=None):
    run = SimpleNamespace(
        metrics=pd.DataFrame() if metrics is None else metrics,
        batch_size=16,
        strategy=SimpleNamespace(name=strategy),
        checkpoint=checkpoint,
    )
    return SimpleNamespace(
        run=run, profile=profile, optimizer=None, chooses=chooses, plans=[(0.0, strategy, 1)], priced=None,
        pending=None, start_s=None, relaunches=[],
    )  # fmt: skip


def test_the_profile_tap_keeps_what_the_latest_launch_profiled_by_batch():
    tap = ProfileTap()
    model, data = Net(), None
    tap[(id(model), 16, id(data))] = (weakref.ref(model), lambda: data, "profile@16")
    assert tap.get((id(model), 16, id(data)))[2] == "profile@16"  # a dict still: the launch's cache
    assert tap.taken() == {16: "profile@16"} and tap.taken() == {}  # taken once
    tap.get((id(model), 16, id(data)))  # a relaunch of the same model reuses it: taken again
    assert tap.taken() == {16: "profile@16"}


def test_auto_lets_only_a_shared_labs_scheduler_choose():
    assert chosen_strategy("auto", shared=True) == ("AllReduce", True)
    assert chosen_strategy("PS", shared=True) == ("PS", False)
    with pytest.raises(LaunchError, match="strategy='auto': only a shared Lab's scheduler chooses"):
        chosen_strategy("auto", shared=False)


def test_without_a_cost_model_a_run_is_priced_by_its_measurements_as_before(profile):
    fn, basis = run_speedup(_job(), None, None)
    assert fn is None and basis == "linear"  # Pollux's start: speedup = replicas
    fn, basis = run_speedup(_job(_records([(0, 1, 0.1), (1, 2, 0.125)])), None, None)
    assert fn is not None and basis == "measured"
    assert fn(np.array([1]), np.array([2]))[0] == pytest.approx(2 * 0.1 / 0.125, rel=1e-6)


def test_before_it_ran_the_cost_model_prices_the_run_at_its_own_strategy_or_the_best(profile):
    base = dl.ResourceSpec.local(2)
    own, basis = run_speedup(_job(profile=profile, strategy="PS"), PSFaster(), base)
    assert isinstance(own, Guarded) and isinstance(own.priced, OwnStrategySpeedup) and basis == "cost model"
    best, _ = run_speedup(_job(profile=profile, chooses=True, strategy="PS"), PSFaster(), base)
    assert isinstance(best, GuardedChoice)
    assert best.strategy_at(1, 2) == "PS"  # a run that lets the scheduler choose: the best there
    plain = StrategySpeedup(CostModel.default(), profile, base)
    # a run that named PS is priced at PS's rates (here twice the plain model's at 2 replicas), not
    # at the best strategy's
    expected = 2 * plain.rates(1, 2)["PS"] / plain.rates(1, 1)["PS"]
    assert own(np.array([1]), np.array([2]))[0] == pytest.approx(expected)
    assert "AllReduce" in plain.strategy_at(1, 2)  # the plain model's best is an all-reduce


def test_after_it_ran_its_measured_steps_correct_the_cost_models_speedup(profile):
    base = dl.ResourceSpec.local(2)
    before, _ = run_speedup(_job(profile=profile), CostModel.default(), base)
    assert before is not None
    slow_two = _records([(0, 1, 0.01), (1, 2, 0.05)])  # two replicas measured 5x slower a step
    job = _job(slow_two, profile=profile)
    job.plans = [(0.0, "AllReduce", 1)]
    assert {r["num_replicas"]: r["strategy"] for r in measured_rows(slow_two, job.plans, 16)} == {
        1: "AllReduce",
        2: "AllReduce",
    }
    after, basis = run_speedup(job, CostModel.default(), base)
    assert after is not None and basis == "cost model + measured"
    s_before, s_after = before(np.array([1]), np.array([2]))[0], after(np.array([1]), np.array([2]))[0]
    assert s_after == pytest.approx(2 * 0.01 / 0.05, rel=0.05) and s_after < 0.5 * s_before


def test_a_run_that_lets_the_scheduler_choose_switches_only_for_a_gain_above_the_margin(profile):
    base = dl.ResourceSpec.local(2)
    workers = ["w0", "w1"]
    job = _job(profile=profile, chooses=True)
    run_speedup(job, PSFaster(), base)
    st = switch_to(job, None, workers, 1)
    assert st is not None and st.builder == "PS"  # the cost model's best when the policy names none
    named = _job(profile=profile)  # the user named AllReduce: it keeps it
    run_speedup(named, PSFaster(), base)
    assert switch_to(named, "PS", workers, 1) is None
    for gain, switches in ((1 + SWITCH_MARGIN / 2, False), (1 + 2 * SWITCH_MARGIN, True)):
        job = _job(profile=profile, chooses=True)
        run_speedup(job, PSAsFastAs(gain), base)
        st = switch_to(job, "PS", workers, 1)  # the policy named PS
        assert (st is not None) == switches, gain  # a gain within the margin is noise: no re-plan


def test_a_relaunch_is_estimated_from_the_runs_own_then_its_start_then_the_others():
    assert estimate_relaunch([2.0, 4.0, 9.0], 1.0, [7.0]) == 4.0
    assert estimate_relaunch([], 1.5, [7.0]) == 1.5
    assert estimate_relaunch([], None, [7.0, 3.0]) == 5.0
    assert estimate_relaunch([], None, []) == RELAUNCH_GUESS


def test_a_restart_costs_the_checkpoints_bytes_at_the_measured_rate_plus_the_measured_relaunch(tmp_path):
    ckpt = tmp_path / "ckpt-000000010.pt"
    ckpt.write_bytes(b"\0" * (4 << 20))
    pricer = RestartPricer(tmp_path)
    pricer.storage = (100e6, 400e6)  # bytes/s as measure_storage would give them
    job = _job(checkpoint=str(ckpt))
    io = (4 << 20) / 100e6 + (4 << 20) / 400e6
    assert pricer.cost(job, []) == pytest.approx(RELAUNCH_GUESS + io)
    # a pause at t, the next segment's first step 2 s later: 2 s less the checkpoint's I/O
    job.run.metrics = _records([(0, 1, 0.1)])
    pricer.mark(job, resumed=True)
    since = job.pending[0]
    more = _records([(0, 1, 0.1), (1, 1, 0.1)])
    more.loc[more["restart"] == 1, "wall_time"] = since + 2.0 + 0.1 * np.arange(20)
    job.run.metrics = more
    pricer.settle(job)
    assert job.pending is None and job.relaunches == [pytest.approx(2.0 - io, abs=0.01)]
    assert pricer.cost(job, []) == pytest.approx(2.0, abs=0.01)


def test_the_storage_rate_is_measured_once_per_lab(tmp_path):
    pricer = RestartPricer(tmp_path)
    write, read = pricer.rates()
    assert write > 0 and read > 0 and pricer.rates() == (write, read)
    assert not list(tmp_path.iterdir())  # the probe's file is gone


def test_a_run_the_cost_model_cannot_price_is_priced_by_its_measurements_and_never_stops_a_round(profile):
    base = dl.ResourceSpec.local(2)
    fn, basis = run_speedup(_job(profile=profile, strategy="MyOwnPlan"), CostModel.default(), base)
    assert fn is None and basis == "linear"  # a hand-made strategy the candidates lack

    def broken(nodes, replicas):
        raise RuntimeError("no plan fits")

    guarded = Guarded(broken, None)
    assert guarded(np.array([1, 1]), np.array([1, 2])).tolist() == [1.0, 2.0]  # linear, as Pollux starts
    assert GuardedChoice(broken, None, "PS").strategy_at(1, 2) == "PS"  # keeps what it runs
