"""Pricing a PS's consistency from each rank's step-time distribution (costmodel/consistency.py): the
order statistic synchronous PS pays, the jitter staleness absorbs, the straggler it does not, the
rate asynchronous PS reaches, and the figures read back from a run's records."""

from __future__ import annotations

import pytest

from distlab.costmodel.consistency import ASYNC, RankTime, measured, rank_times, simulate
from distlab.errors import DistlabError, LaunchError

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
    # asynchronous PS never reaches the loss; asynchronous gossip priced too (else it is unpriced: last)
    g = {0: 1.0, 1: 1.0, 4: 1.0, "async": 1000.0, "async gossip": 1.0}
    table = ranking(cm, prof, res, cands, g)
    assert list(table["goodput"]) == sorted(table["goodput"], reverse=True)
    assert table["strategy"].iloc[-1] == "PSLoadBalancing(servers=all,sync=False)"
    # without g, asynchronous PS ties with staleness 4 here (2 ranks, no straggler): one row
    assert any("sync=False" in s and "staleness=4" in s for s in ranking(cm, prof, res, cands)["strategy"])
    picker = StrategyPicker(prof, res, cm, top=60, staleness_cost=g)
    assert "sync=False" in picker.table.options[-1][0]


def _ps_plans(workers=4):
    import distlab as dl
    from distlab.costmodel.model import CostModel
    from distlab.resources import ResourceSpec

    prof = dl.profile(dl.zoo.get("mlp", width=64, in_features=32), batch_size=16)
    res = ResourceSpec.local(workers=workers)
    cands = [c for c in dl.strategy.candidates(prof, res) if c.builder == "PSLoadBalancing"]
    return CostModel.default(), prof, res, cands


def _by_key(table):
    from distlab.costmodel.convergence import key_of

    return {key_of(plan): row for plan, (_, row) in zip(table["plan"], table.iterrows(), strict=True)}


def test_without_a_measured_g_every_stale_or_asynchronous_plan_says_its_convergence_is_not_counted():
    import distlab as dl

    cm, prof, res, _ = _ps_plans(workers=2)
    table = cm.rank(prof, res, dl.strategy.candidates(prof, res))
    unsynchronised = [p.stale or (p.gossip is not None and p.gossip.asynchronous) for p in table["plan"]]
    assert sum(unsynchronised) >= 4  # stale PS at s = 1 and 4, asynchronous PS, asynchronous gossip
    for off, note in zip(unsynchronised, table["note"], strict=True):
        assert note.startswith("convergence not counted: lab.probe_staleness") if off else note == ""
    said = f"convergence not counted for {sum(unsynchronised)} "
    assert any(n.startswith(said) for n in table.attrs["notes"])


def test_a_staleness_the_user_did_not_probe_is_unpriced_and_ranked_after_every_priced_plan():
    import math

    cm, prof, res, cands = _ps_plans()
    table = cm.rank(prof, res, cands, staleness_cost={0: 1.0, 1: 1.5})  # 4 and async not probed
    rows = _by_key(table)
    for k in (4, "async"):
        assert math.isnan(rows[k]["goodput"]), f"g({k}) was never measured: not free"
    assert rows[1]["goodput"] == pytest.approx(rows[1]["throughput"] / 1.5) and rows[1]["note"] == ""
    for k, probe in ((4, "staleness=(4,)"), ("async", "staleness=('async',)")):
        assert rows[k]["note"].startswith(f"convergence not counted: lab.probe_staleness({probe})")
    priced = [g == g for g in table["goodput"]]
    assert priced == sorted(priced, reverse=True)  # every priced plan first
    # the key the builders use for asynchronous staleness, None, is the probe's "async"
    again = _by_key(cm.rank(prof, res, cands, staleness_cost={0: 1.0, None: 2.0}))
    assert again["async"]["goodput"] == pytest.approx(again["async"]["throughput"] / 2.0)
    with pytest.raises(DistlabError, match=r"staleness_cost\[4\]: 0.0 is not a positive"):
        cm.rank(prof, res, cands, staleness_cost={4: 0.0})


def test_goodput_follows_the_throughput_the_clocks_priced_with_a_noise_scale():
    cm, prof, res, cands = _ps_plans()
    table = cm.rank(prof, res, cands, noise_scale=50.0)
    assert list(table["goodput"]) == sorted(table["goodput"], reverse=True)
    for _, row in table.iterrows():
        assert row["goodput"] == pytest.approx(row["throughput"] * row["efficiency"], rel=1e-9)
    stale = table[[p.stale for p in table["plan"]]]
    assert len(stale) == 3 and all(n.startswith("convergence not counted") for n in stale["note"])


def test_a_measured_g_below_one_is_counted_as_one_with_a_note():
    """Staleness is never credited with faster convergence: under Adam each stale push is a full
    optimizer step of one worker's gradient (runtime/stale_ps.py), so a probe's g below 1 is an
    effective learning-rate change, not a gain of staleness."""
    from distlab.costmodel.consistency import price

    cm, prof, res, cands = _ps_plans()
    rows = _by_key(cm.rank(prof, res, cands, staleness_cost={0: 1.0, 1: 0.5, 4: 1.25, "async": 0.6}))
    for k in (1, "async"):
        assert rows[k]["goodput"] == pytest.approx(rows[k]["throughput"])  # not 2x nor 1.7x
        assert "measured below 1, counted as 1" in rows[k]["note"]
    assert rows[4]["goodput"] == pytest.approx(rows[4]["throughput"] / 1.25) and rows[4]["note"] == ""
    stale = next(c for c in cands if c.consistency == (True, 1))
    p = price(cm, prof, res, stale, g=0.5)
    assert p.efficiency == 1.0 and p.goodput == pytest.approx(p.throughput)
    assert any("g(s=1) = 0.50 measured below 1" in n for n in p.notes)


def _records(rate, ranks=2, steps=60):
    """A run's records whose loss falls at ``rate`` per step of every rank."""
    return [
        {"rank": r, "step": c, "wall_time": c + r / ranks, "loss": 1.0 / (1.0 + rate * c)}
        for c in range(steps)
        for r in range(ranks)
    ]


def test_the_probe_keys_asynchronous_staleness_as_the_ranking_looks_it_up():
    from types import SimpleNamespace

    from distlab.costmodel.convergence import key_of
    from distlab.runs.staleness import probe

    cm, prof, res, cands = _ps_plans()
    rates = {(True, 0): 1.0, (True, 1): 0.8, (False, 0): 0.5}
    launched = []

    def launch(model, st, **kw):
        launched.append(st.consistency)
        return SimpleNamespace(metrics=_records(rates[st.consistency]))

    def build(options):
        import distlab as dl

        return dl.strategy.build("PSLoadBalancing", prof, res, servers="all", **options)

    g = probe(launch, build, None, None, staleness=(1, None, "async"))
    assert launched == [(True, 0), (True, 1), (False, 0)]  # None and "async" are one run
    asp = next(c for c in cands if not c.consistency[0])
    assert set(g) == {0, 1, "async"} and key_of(asp) in g and g["async"] > g[1] > 1.0
    rows = _by_key(cm.rank(prof, res, cands, staleness_cost=g))
    assert rows["async"]["goodput"] == pytest.approx(rows["async"]["throughput"] / g["async"])
    launched.clear()
    with pytest.raises(LaunchError, match="staleness: 'x' is not an integer >= 0 or 'async'"):
        probe(launch, build, None, None, staleness=(1, "x"))
    assert launched == []  # refused before any run


def test_a_probe_that_finds_staleness_faster_warns_that_the_ranking_counts_it_as_one():
    from types import SimpleNamespace

    from distlab.errors import DistlabWarning
    from distlab.runs.staleness import probe

    def launch(model, st, **kw):
        return SimpleNamespace(metrics=_records(1.0 if st.consistency == (True, 0) else 3.0))

    _, prof, res, _ = _ps_plans()

    def build(options):
        import distlab as dl

        return dl.strategy.build("PSLoadBalancing", prof, res, servers="all", **options)

    with pytest.warns(DistlabWarning, match=r"g\(1\) = 0\.\d+ below 1; the ranking counts it as 1"):
        g = probe(launch, build, None, None, staleness=(1,))
    assert g[1] < 1.0  # the measurement itself is returned as measured
