"""dl.plot figures carry the right data: points, bands, stacked parts, scaling lines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import distlab as dl
from distlab.errors import DistlabError
from tests.costmodel.toys import allreduce, exact_model, plan, toy_profile, toy_resources


def _runs() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "strategy": ["AllReduce", "AllReduce", "PS", "PS"],
            "predicted_throughput": [100.0, 210.0, 80.0, np.nan],
            "measured_throughput": [95.0, 200.0, 100.0, 120.0],
            "world": [1, 2, 2, 4],
            "batch": [32, 32, 32, 32],
            "model": ["mlp"] * 4,
        }
    )


def test_predicted_vs_measured_scatter_band_and_hover(tmp_path):
    fig = dl.plot.predicted_vs_measured(_runs())
    names = [t.name for t in fig.data]
    assert "y = x" in names and "AllReduce" in names and "PS" in names
    ar = next(t for t in fig.data if t.name == "AllReduce")
    assert list(ar.x) == [95.0, 200.0] and list(ar.y) == [100.0, 210.0]
    ps = next(t for t in fig.data if t.name == "PS")
    assert list(ps.x) == [100.0]  # the row without a prediction is left out
    assert "world: 2" in ps.text[0] and "model: mlp" in ps.text[0] and "-20.0%" in ps.text[0]
    upper, lower = fig.data[0], fig.data[1]
    np.testing.assert_allclose(np.asarray(upper.y) / np.asarray(upper.x), 1.1)
    np.testing.assert_allclose(np.asarray(lower.y) / np.asarray(lower.x), 0.9)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    out = tmp_path / "pvm.html"
    fig.write_html(out)
    assert out.stat().st_size > 1000


def test_predicted_vs_measured_names_missing_columns():
    with pytest.raises(DistlabError, match="measured_throughput"):
        dl.plot.predicted_vs_measured(pd.DataFrame({"strategy": ["a"], "predicted_throughput": [1.0]}))


def test_breakdown_from_rank_table_and_from_predictions():
    prof, res = toy_profile(), toy_resources(2)
    cm = exact_model(beta=1e-6, optimizer_per_byte=1e-9)
    cands = [
        plan(prof, allreduce(0, 1, 2), res, builder="bucketed"),
        plan(prof, allreduce(0, 0, 0), res, builder="one"),
    ]
    table = cm.rank(prof, res, cands)
    fig = dl.plot.breakdown(table)
    assert fig.layout.barmode == "stack"
    assert [t.name for t in fig.data] == ["compute", "exposed communication", "optimizer"]
    comm = next(t for t in fig.data if t.name == "exposed communication")
    np.testing.assert_allclose(comm.y, table["comm"].to_numpy() * 1e3)
    assert list(comm.x) == list(table["strategy"])
    preds = [cm.predict(prof, res, s) for s in cands]
    fig2 = dl.plot.breakdown(preds)
    total = sum(np.asarray(t.y) for t in fig2.data)
    np.testing.assert_allclose(total, [p.step_time * 1e3 for p in preds])


def test_scaling_one_line_per_strategy_over_world_sizes():
    prof = toy_profile()
    res = toy_resources(2, cores=2)
    cm = exact_model(beta=1e-7)
    cands = [
        plan(prof, allreduce(0, 1, 2), res, builder="AllReduce"),
        plan(prof, allreduce(0, 0, 0), res, builder="AR1"),
    ]
    fig = dl.plot.scaling(prof, (res, [1, 2, 4, 8]), cands, cost_model=cm)
    assert [t.name for t in fig.data] == ["AllReduce", "AR1"]
    assert list(fig.data[0].x) == [1, 2, 4, 8]
    assert fig.data[0].y[0] == pytest.approx(
        cm.predict(
            prof, toy_resources(1, cores=2), plan(prof, allreduce(0, 1, 2), toy_resources(1, cores=2))
        ).throughput
    )
    fig2 = dl.plot.scaling(prof, [toy_resources(w, cores=2) for w in (1, 2)], cands[:1], cost_model=cm)
    assert list(fig2.data[0].x) == [1, 2]
    assert fig2.data[0].y[1] == pytest.approx(cm.predict(prof, res, cands[0]).throughput)


def test_log_axes_read_as_numbers_and_the_timeline_colours_differ():
    """Issue 38: plotly labelled a log axis's minor ticks by their first digit ("5, 2, 1000"); the
    timeline drew predicted compute in backward's blue."""
    from distlab.notebook.plots import log_ticks
    from distlab.notebook.timeline import COLOURS

    assert log_ticks(700, 2400) == [1000.0, 2000.0]
    assert log_ticks(1500, 60000) == [2000.0, 5000.0, 10000.0, 20000.0, 50000.0]
    runs = pd.DataFrame(
        {
            "strategy": ["A", "B"],
            "predicted_throughput": [1800.0, 900.0],
            "measured_throughput": [706.0, 1500.0],
        }
    )
    fig = dl.plot.predicted_vs_measured(runs)
    assert list(fig.layout.xaxis.ticktext) == ["1,000", "2,000"] == list(fig.layout.yaxis.ticktext)
    assert len(set(COLOURS.values())) == len(COLOURS)


def test_run_ids_are_unique_across_a_notebooks_labs():
    from distlab.lab import next_run_id

    first, second = next_run_id(), next_run_id()  # what any two Labs hand out
    assert first.split("-")[0] != second.split("-")[0]
