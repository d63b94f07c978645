"""The ranking a notebook shows: the single-process baseline, exact ties once, units."""

from __future__ import annotations

import pytest

import distlab as dl
from distlab.notebook.ranking import SINGLE_PROCESS, display_table, ranking, top_with_baseline
from distlab.resources import Link


def _ranked(prof, res):
    return ranking(dl.CostModel.default(), prof, res, dl.strategy.candidates(prof, res))


@pytest.fixture(scope="module")
def mlp():
    """The MLP's profile, taken once: a profile and a ranking of every candidate cost seconds each."""
    return dl.profile(dl.zoo.get("mlp"), batch_size=8)


@pytest.fixture(scope="module")
def table(mlp):
    """The ranking on 2 local workers; the tests only read it."""
    return _ranked(mlp, dl.ResourceSpec.local(workers=2))


def test_the_single_process_row_is_ranked_with_one_worker(table):
    row = table[table["strategy"] == SINGLE_PROCESS]
    assert len(row) == 1 and int(row["world"].iloc[0]) == 1 and row["plan"].iloc[0].world == 1
    assert list(table["throughput"]) == sorted(table["throughput"], reverse=True)


def test_exact_ties_are_one_row_and_nothing_is_lost(mlp, table):
    names = [n for s in table["strategy"] for n in s.split(" = ")]
    every = [s.name for s in dl.strategy.candidates(mlp, dl.ResourceSpec.local(workers=2))]
    assert sorted(names) == sorted([*every, SINGLE_PROCESS])  # each candidate once, merged or not
    merged = [s for s in table["strategy"] if "compressor=fp16" in s]
    assert merged and "compressor=bf16" in merged[0]  # same bytes on the wire: one prediction


def test_a_slow_link_makes_one_process_win_and_the_ranking_says_so(mlp, table):
    res = dl.ResourceSpec.local(workers=2)
    slow = res.with_links(**{c: Link(1e-2, 1e6) for c in res.links})  # 1 MB/s, 10 ms
    ranked = _ranked(mlp, slow)
    assert ranked["strategy"].iloc[0] == SINGLE_PROCESS
    assert ranked.attrs["single_wins"] and "do not distribute" in ranked.attrs["note"]
    fast = table  # the same profile: a near tie cannot flip between two profiles
    assert not fast.attrs["single_note"] or fast.attrs["single_wins"]


def test_the_table_shows_the_baseline_below_the_top_rows_with_units(table):
    shown = display_table(table, top=1).frame
    assert SINGLE_PROCESS in set(shown["strategy"]) and len(top_with_baseline(table, 1)) <= 2
    assert list(shown.columns[:4]) == ["strategy", "workers", "samples/s", "step (ms)"]
    assert shown["samples/s"].dtype.kind == "i"
    assert "index" not in shown.columns and "<th" in display_table(table)._repr_html_()


def test_the_table_says_which_plans_convergence_it_does_not_count(table):
    stale = table[[p.stale for p in table["plan"]]]
    assert len(stale) >= 1 and all(
        n.startswith("convergence not counted: lab.probe_staleness") for n in stale["note"]
    )
    assert "convergence not counted for " in table.attrs["note"]  # what %distlab simulate shows above it
    shown = display_table(table, top=len(table)).frame
    assert "note" in shown.columns
    assert set(shown.loc[shown["strategy"].isin(stale["strategy"]), "note"]) <= set(stale["note"])
    assert set(shown.loc[shown["strategy"] == SINGLE_PROCESS, "note"]) == {""}


def test_with_a_partial_staleness_cost_unpriced_plans_rank_last_and_show_no_goodput(mlp):
    res = dl.ResourceSpec.local(workers=2)
    cands = dl.strategy.candidates(mlp, res)
    table = ranking(dl.CostModel.default(), mlp, res, cands, staleness_cost={1: 1.2})
    unpriced = table["goodput"].isna().to_numpy()
    assert unpriced.any() and list(unpriced) == sorted(unpriced)  # every priced row first
    single = table[table["strategy"] == SINGLE_PROCESS]
    assert float(single["goodput"].iloc[0]) == float(single["throughput"].iloc[0])  # one process: g = 1
    shown = display_table(table, top=len(table)).frame
    assert set(shown["goodput"][unpriced]) == {"-"}
    assert all(n.startswith("convergence not counted") for n in shown["note"][unpriced])
