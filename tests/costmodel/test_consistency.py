"""Pricing a PS's consistency from each rank's step-time distribution (costmodel/consistency.py): the
order statistic synchronous PS pays, the jitter staleness absorbs, the straggler it does not, the
rate asynchronous PS reaches, and the figures read back from a run's records."""

from __future__ import annotations

import pytest

from distlab.costmodel.consistency import ASYNC, RankTime, measured, rank_times, simulate
from distlab.errors import DistlabError

RANKS = [RankTime(0.1, 0.02)] * 4


def _step(s, **kw):
    return simulate(RANKS, s, push=0.003, pull=0.003, batch=32, **kw).step_time


def test_without_variation_every_consistency_costs_the_step_and_its_exchange():
    for s in (0, 1, 4, ASYNC):
        assert _step(s) == pytest.approx(0.106, rel=0.03)


def test_jitter_costs_synchronous_ps_its_order_statistic_and_staleness_absorbs_it():
    sync, s1, s4 = (_step(s, jitter=0.2) for s in (0, 1, 4))
    mean = 0.1 * 1.2 + 0.006
    # E[max of 4 exponentials] = 1 + 1/2 + 1/3 + 1/4 = 2.08 jitter shares, not 1
    assert sync == pytest.approx(0.1 * (1 + 0.2 * 2.08) + 0.006, rel=0.04)
    assert sync > s1 > s4 > mean * 0.99 and s4 < 1.06 * mean


def test_a_persistent_straggler_is_not_absorbed_by_staleness_but_async_runs_past_it():
    slow = {3: 1.5}
    sync, s1, s4, asp = (_step(s, slowdown=slow) for s in (0, 1, 4, ASYNC))
    assert s4 > 0.97 * sync and s1 > 0.97 * sync  # staleness gains under 5%
    fast, slower = 0.1 + 0.006, 0.15 + 0.006
    assert asp == pytest.approx((3 * fast + slower) / 4, rel=0.03)
    got = simulate(RANKS, ASYNC, 0.003, 0.003, 32, slow)
    assert got.throughput == pytest.approx(32 * (3 / fast + 1 / slower), rel=0.03)
    assert got.staleness_seen > 10  # nothing bounds it
    bounded = simulate(RANKS, ASYNC, 0.003, 0.003, 32, slow, server_rate=20.0)
    assert bounded.throughput == pytest.approx(32 * 20, rel=0.01) and "servers' links" in bounded.notes[0]
    assert simulate(RANKS, 2, 0.003, 0.003, 32, slow).staleness_seen <= 2


def test_bad_input_is_one_line():
    with pytest.raises(DistlabError, match="staleness -1 must be an integer >= 0 or None"):
        simulate(RANKS, -1, 0.0, 0.0, 32)
    with pytest.raises(DistlabError, match="no ranks"):
        simulate([], 0, 0.0, 0.0, 32)
    with pytest.raises(DistlabError, match="no step records"):
        rank_times([])


def test_a_runs_records_give_each_ranks_compute_and_the_measured_figures():
    records = [
        {
            "rank": r,
            "step": t,
            "step_time": 0.1 + 0.05 * r,
            "comm_time": 0.02,
            "delay": 0.01 * r,
            "staleness": r,
        }
        for r in range(2)
        for t in range(10)
    ]
    times = rank_times(records)
    assert [round(t.base, 3) for t in times] == [0.08, 0.12] and times[0].noise == 0.0 and times[0].rest == 0
    split = rank_times([{**r, "compute": 0.05} for r in records])  # forward and backward, the rest apart
    assert [(round(t.base, 3), round(t.rest, 3)) for t in split] == [(0.05, 0.03), (0.05, 0.07)]
    assert simulate(split, 0, 0.0, 0.0, 16, {1: 2.0}).step_time == pytest.approx(0.17, rel=0.01)
    m = measured(records, batch=16)
    assert m["throughput"] == pytest.approx(16 / 0.1 + 16 / 0.15) and m["staleness_seen"] == 0.5


def test_the_cost_model_prices_a_stale_plan_at_its_consistency_and_ranks_by_goodput():
    import distlab as dl
    from distlab.costmodel.model import CostModel
    from distlab.resources import ResourceSpec

    prof = dl.profile(dl.zoo.get("mlp", width=64, in_features=32), batch_size=16)
    res, cm = ResourceSpec.local(workers=4), CostModel.default()
    sync = dl.strategy.build("PSLoadBalancing", prof, res, servers="all")
    stale = dl.strategy.build("PSLoadBalancing", prof, res, servers="all", staleness=4)
    p = cm.predict(prof, res, stale)
    assert any(n.startswith("consistency s=4") for n in p.notes)
    assert p.step_time == pytest.approx(sum(p.breakdown.values()), rel=1e-6)
    assert not any(n.startswith("consistency") for n in cm.predict(prof, res, sync).notes)
    cands = [c for c in dl.strategy.candidates(prof, res) if c.builder == "PSLoadBalancing"]
    g = {0: 1.0, 1: 1.2, 4: 2.0, "async": 4.0}
    table = cm.rank(prof, res, cands, staleness_cost=g)
    assert list(table["goodput"]) == sorted(table["goodput"], reverse=True)
    for _, row in table.iterrows():
        want = g[0 if not row["plan"].stale else (row["plan"].consistency[1] or "async")]
        assert row["goodput"] == pytest.approx(row["throughput"] / want)


def test_the_notebooks_ranking_and_the_picker_order_by_goodput_with_a_staleness_cost():
    import distlab as dl
    from distlab.costmodel.model import CostModel
    from distlab.notebook.picker import StrategyPicker
    from distlab.notebook.ranking import ranking

    prof = dl.profile(dl.zoo.get("mlp", width=64, in_features=32), batch_size=16)
    res, cm = dl.ResourceSpec.local(workers=2), CostModel.default()
    cands = dl.strategy.candidates(prof, res)
    g = {0: 1.0, 1: 1.0, 4: 1.0, "async": 1000.0}  # asynchronous PS never reaches the loss
    table = ranking(cm, prof, res, cands, g)
    assert list(table["goodput"]) == sorted(table["goodput"], reverse=True)
    assert table["strategy"].iloc[-1] == "PSLoadBalancing(servers=all,sync=False)"
    # without g, asynchronous PS ties with staleness 4 here (2 ranks, no straggler): one row
    assert any("sync=False" in s and "staleness=4" in s for s in ranking(cm, prof, res, cands)["strategy"])
    picker = StrategyPicker(prof, res, cm, top=60, staleness_cost=g)
    assert "sync=False" in picker.table.options[-1][0]
