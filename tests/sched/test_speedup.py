"""Speedups from distlab's cost model, the strategy re-chosen per allocation, and measured restart costs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from distlab.errors import SchedulerError
from distlab.sched import GoodputPolicy, JobSpec, allocate
from distlab.sched.restart import checkpoint_bytes, measure_storage, restart_seconds
from distlab.sched.speedup import StrategySpeedup, allocation_resources

PROFILE = SimpleNamespace(batch_size=32)


def _compute(batch: float) -> float:
    return 0.2 + 0.025 * batch  # 1.0 s at 32


def _comm(name: str, nodes: int, replicas: int) -> float:
    """Ring-shaped predicted communication: PS sends less within a host and across hosts."""
    if replicas == 1:
        return 0.0
    per = {"AllReduce": (0.1, 0.3), "PS": (0.05, 0.2)}[name][nodes > 1]
    return 2 * (replicas - 1) / replicas * per


def _extra(name: str) -> float:
    return {"AllReduce": 0.0, "PS": 0.2}[name]  # PS's servers apply the update: more compute


class StubModel:
    """A cost model whose figures are the formulas above (``CostModel.rank``'s columns)."""

    def __init__(self) -> None:
        self.calls = 0

    def rank(self, profile, resources, plans, **_):  # noqa: ANN001, ANN201
        self.calls += 1
        nodes, replicas = resources.num_hosts, resources.world
        rows = []
        for name in plans:
            compute = _compute(profile.batch_size) + _extra(name)
            step = compute + _comm(name, nodes, replicas)
            rows.append({"strategy": name, "throughput": replicas * profile.batch_size / step,
                         "step_time": step, "compute": compute})  # fmt: skip
        return pd.DataFrame(rows).sort_values("throughput", ascending=False)


def _speedup() -> StrategySpeedup:
    return StrategySpeedup(StubModel(), PROFILE, candidates=lambda p, r: ["AllReduce", "PS"])  # type: ignore[arg-type]


def test_before_running_the_cost_model_gives_the_speedup_and_the_best_strategy():
    s = _speedup()
    one = 32 / _compute(32)
    assert s(np.array([1]), np.array([1]))[0] == pytest.approx(1.0)
    # two replicas on one host under AllReduce: 64 samples per (1.0 + 0.1) s
    assert s(np.array([1]), np.array([2]))[0] == pytest.approx(64 / 1.1 / one)
    assert s.strategy_at(1, 2) == "AllReduce"
    assert s.choose(1, 2).basis == "cost model"
    assert s(np.array([1, 2]), np.array([0, 4])).tolist()[0] == 0.0


def test_measured_communication_above_the_prediction_moves_the_choice_to_the_strategy_that_sends_less():
    s = _speedup()
    # predicted at 4 workers on 2 hosts: AllReduce 1.0 + 0.45 s, PS 1.2 + 0.3 s
    assert s.strategy_at(2, 4) == "AllReduce"
    # the job ran AllReduce on 1-4 workers: its compute as predicted, its communication 3x
    rows = [
        {
            "strategy": "AllReduce",
            "num_nodes": n,
            "num_replicas": r,
            "local_bsz": b,
            "step_time": _compute(b) + 3 * _comm("AllReduce", n, r),
        }  # fmt: skip
        for n, r in ((1, 1), (1, 2), (1, 3), (1, 4), (2, 2), (2, 4))
        for b in (16, 32, 64)
    ]
    after = s.with_measurements(rows)
    # AllReduce 1.0 + 1.35 s as measured; PS's communication corrected alike: 1.2 + 0.9 s
    assert after.strategy_at(2, 4) == "PS"
    assert after.choose(2, 4).basis == "cost model"
    # 8 workers on 4 hosts, never run: AllReduce's step from its fitted step model (1.0 + 1.575 s)
    rates = after.rates(4, 8)
    assert rates["AllReduce"] == pytest.approx(8 * 32 / 2.575, rel=0.01)
    assert rates["PS"] == pytest.approx(8 * 32 / (1.2 + 3 * 0.35), rel=0.01)
    assert after.strategy_at(4, 8) == "PS"
    # before the measurements the same allocation was priced as predicted
    assert s.rates(4, 8)["AllReduce"] == pytest.approx(8 * 32 / 1.525)


def test_the_allocation_names_the_strategy_each_job_runs():
    s = _speedup()
    workers = {"a": "h0", "b": "h0", "c": "h1", "d": "h1"}
    job = JobSpec("j", s, max_replicas=4, age=600.0)
    alloc = allocate([job], workers)
    assert len(alloc["j"]) == 4
    assert alloc.strategies == {"j": s.strategy_at(2, 4)}
    # unchanged workers keep the strategy the job runs, whatever is best there now
    kept = allocate([JobSpec("j", s, max_replicas=4, age=600.0, strategy="PS")], workers, alloc)
    assert kept["j"] == alloc["j"] and kept.strategies == {"j": "PS"}


def test_a_measured_restart_cost_keeps_a_job_with_a_large_checkpoint_where_it_is():
    workers = {"a": "h0", "b": "h0", "c": "h0", "d": "h0"}
    previous = {"j": ("a", "b")}
    cheap = restart_seconds(nbytes=50e6, relaunch=2.0, write_rate=500e6, read_rate=2e9)
    dear = restart_seconds(nbytes=400e9, relaunch=2.0, write_rate=500e6, read_rate=2e9)
    grow = allocate([JobSpec("j", None, max_replicas=4, age=600.0, restart_cost=cheap)], workers, previous)
    stay = allocate([JobSpec("j", None, max_replicas=4, age=600.0, restart_cost=dear)], workers, previous)
    assert len(grow["j"]) == 4  # 4 x 600 / 602.1 beats keeping 2
    assert stay["j"] == ("a", "b")  # 4 x 600 / 1602 does not
    # without a measured cost a job gets the policy's delay
    slow = GoodputPolicy(restart_delay=1200.0).allocate(
        [JobSpec("j", None, 0, 4, age=600.0)], workers, previous
    )
    assert slow["j"] == ("a", "b")


def test_restart_seconds_adds_the_checkpoint_both_ways_to_the_relaunch():
    assert restart_seconds(1e9, 3.0, write_rate=500e6, read_rate=2e9) == pytest.approx(5.5)
    assert restart_seconds(1e9, 3.0, write_rate=1e9) == pytest.approx(5.0)
    with pytest.raises(SchedulerError, match="write_rate=0"):
        restart_seconds(1e9, 3.0, write_rate=0)
    with pytest.raises(SchedulerError, match="relaunch=-1"):
        restart_seconds(1e9, -1, write_rate=1e9)
    with pytest.raises(SchedulerError, match="restart_cost=-5"):
        JobSpec("j", restart_cost=-5)


def test_storage_rates_are_measured_on_a_real_file(tmp_path):
    write, read = measure_storage(tmp_path, nbytes=4 << 20)
    assert 1e6 < write < 1e12 and 1e6 < read < 1e13
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_allocation_resources_spread_replicas_over_hosts():
    res = allocation_resources(None, 2, 5)
    assert res.world == 5 and res.num_hosts == 2
    assert [len(res.ranks_on(h)) for h in res.hosts] == [3, 2]
    with pytest.raises(SchedulerError, match="3 hosts"):
        allocation_resources(None, 3, 2)


def test_a_real_tiny_model_profile_ranks_synchronous_strategies_per_allocation():
    torch = pytest.importorskip("torch")
    import distlab as dl
    from distlab.costmodel import CostModel

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    prof = dl.profile(model, batch_size=32)
    s = StrategySpeedup(CostModel.default(), prof)
    assert s(np.array([1]), np.array([1]))[0] == pytest.approx(1.0)
    assert s(np.array([2]), np.array([4]))[0] > 1.0
    assert checkpoint_bytes(prof) == 3 * sum(v.nbytes for v in prof.variables)
    workers = {"a": "h0", "b": "h0", "c": "h1", "d": "h1"}
    alloc = allocate(
        [JobSpec("x", s, max_replicas=4, age=600.0), JobSpec("y", s, max_replicas=4, age=600.0)], workers
    )
    assert set(alloc) == {"x", "y"} and set(alloc.strategies) == {"x", "y"}
    for name, chosen in alloc.items():
        named = alloc.strategies[name]
        choice = s.choose(len({workers[w] for w in chosen}), len(chosen))
        assert named == choice.strategy
        assert "Gossip" not in named and "staleness" not in named and "sync=False" not in named
