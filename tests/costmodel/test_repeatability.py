"""A calibration's repeated stages: their medians, their spread, the refusal of one that does not repeat."""

from __future__ import annotations

import pytest

from distlab.calibration.repeat import (
    REPEAT_LIMIT,
    StageSpread,
    link_figures,
    mean_rows,
    refusal,
    spread,
    stage_spread,
    unrepeatable,
)
from distlab.costmodel.calibrate import fit_microbenchmarks
from distlab.costmodel.params import CostParams

from .test_calibrate import synthetic_rows


def test_a_stages_spread_is_the_median_of_its_figures_and_names_the_worst():
    assert spread([1.0, 1.1, 0.9]) == pytest.approx(0.2) and spread([5.0]) == 0.0
    s = stage_spread(
        "training loop", {"a": [1.0, 1.02], "b": [1.0, 1.5, 1.0], "c": [2.0, 2.1], "once": [9.0]}
    )
    assert s is not None and s.figures == 3 and s.repeats == 3  # "once" was measured once: no spread
    assert s.spread == pytest.approx(0.1 / 2.05) and s.worst == pytest.approx(0.5) and s.worst_at == "b"
    assert stage_spread("x", {"once": [1.0]}) is None


def test_repeats_are_combined_point_by_point_at_their_mean():
    a = [
        {"collective": "allreduce", "world": 2, "nbytes": 4096, "link": "intra", "seconds": s} for s in (1.0,)
    ]
    rows = mean_rows(
        [
            a + [{"collective": "allreduce", "world": 2, "nbytes": 1 << 20, "link": "intra", "seconds": 9.0}],
            [{**a[0], "seconds": 3.0}],
            [{**a[0], "seconds": 8.0}],
        ]
    )
    by_size = {r["nbytes"]: r["seconds"] for r in rows}
    # the mean (the median would be 3.0); a point one repeat measured keeps its figure
    assert by_size == {4096: 4.0, 1 << 20: 9.0}


def _fit(rows):
    return fit_microbenchmarks(rows, CostParams())[0]


def test_repeats_of_a_steady_cluster_pass_and_a_link_that_halved_is_refused_in_one_line():
    steady = [_fit(synthetic_rows(noise=0.03, seed=s)) for s in range(3)]
    s = stage_spread("collectives", link_figures(steady, 4))
    assert s is not None and s.spread < 0.05 and unrepeatable([s]) is None
    # one repeat saw every collective at half its bandwidth (a link that drops to half its rate)
    slow = [
        {**r, "seconds": r["seconds"] * 2} if r["collective"] != "compute" else r
        for r in synthetic_rows(seed=9)
    ]
    moved = stage_spread("collectives", link_figures([*steady[:2], _fit(slow)], 4))
    assert moved is not None and moved.spread > REPEAT_LIMIT
    worst = unrepeatable([s, moved])
    assert worst is moved
    line = refusal(worst)
    assert "\n" not in line and "collectives stage did not repeat" in line and "lab.calibrate() again" in line
    assert f"{moved.spread:.0%}" in line and "not cached" in line


def test_a_contention_that_moves_between_repeats_is_seen():
    a, b = _fit(synthetic_rows(noise=0.0)), _fit(synthetic_rows(noise=0.0))
    figures = link_figures([a, b.with_(contention=0.45)], 2)
    assert spread(figures["compute slowdown"]) == pytest.approx((1.45 - 1.1) / ((1.45 + 1.1) / 2))


def test_the_spread_travels_in_the_fingerprint_form():
    s = StageSpread("training loop", 0.04, 0.2, "AllReduce on reference 1 at 2 ranks", 3, 17)
    assert StageSpread(**s.to_dict()) == s and "4.0%" in s.describe()


def test_a_calibration_shows_its_repeatability_and_a_refusal():
    from distlab.costmodel import CostModel

    base = CostModel.default()
    spreads = [
        StageSpread("collectives", 0.021, 0.08, "allgather/intra", 3, 7).to_dict(),
        StageSpread("training loop", 0.2, 0.6, "PS on reference 1 at 2 ranks", 3, 17).to_dict(),
    ]
    cm = base.with_params(base.params, calibrated=True, source="microbenchmarks", repeatability=spreads)
    assert repr(cm) == "<CostModel microbenchmarks, repeats within 20.0%>"
    html = cm._repr_html_()
    assert "collectives: 2.1% (median of 7 figures over 3 repeats" in html and "Not cached" not in html
    refused = cm.with_params(cm.params, unrepeatable=spreads[1])
    assert "<b>Not cached</b>: the training loop stage did not repeat" in refused._repr_html_()
    assert repr(base) == "<CostModel uncalibrated>"
