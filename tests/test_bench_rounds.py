"""Accuracy over interleaved rounds: predictions scored against medians, beside the ceiling and the spread."""

from __future__ import annotations

import pandas as pd
import pytest

from distlab.bench.rounds import MIN_ROUNDS, interleaved, score_rounds
from distlab.errors import DistlabError


def _runs(table: dict[str, list[float]], predicted: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"model": "m", "builder": b, "world": 2, "measured": t, "profile": predicted[b]}
            for b, ts in table.items()
            for t in ts
        ]
    )


def test_interleaving_runs_every_configuration_once_a_round_alternating_direction():
    assert list(interleaved(3, 2)) == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
    with pytest.raises(DistlabError, match="rounds=0"):
        list(interleaved(3, 0))


def test_a_prediction_is_scored_against_the_median_not_an_outlying_round():
    # AllReduce's rounds: 100 four times and one slow round at 50; a predictor of 100 is exact
    runs = _runs(
        {"AllReduce": [100, 100, 50, 100, 100], "PS": [80, 82, 78, 80, 80]}, {"AllReduce": 100, "PS": 88}
    )
    rows, s = score_rounds(runs, ["profile"])
    assert rows.set_index("builder").loc["AllReduce", "profile_error"] == 0.0
    assert s["profile_mape"] == pytest.approx((0 + 0.1) / 2)
    assert s["profile_max"] == pytest.approx(0.1)
    # the median scored against the single rounds: the slow round is 100% off, the rest exact
    ar = rows.set_index("builder").loc["AllReduce"]
    assert ar["ceiling_error"] == pytest.approx(1.0 / 5)
    assert ar["spread"] == pytest.approx(0.5)
    assert s["spread_max"] == pytest.approx(0.5) and s["rounds_enough"] and s["rounds_min"] == MIN_ROUNDS


def test_regret_and_a_predicted_best_that_is_the_measured_worst():
    runs = _runs(
        {"AllReduce": [100] * 5, "PS": [60] * 5, "Gossip": [90] * 5}, {"AllReduce": 1, "PS": 3, "Gossip": 2}
    )
    _, s = score_rounds(runs, ["profile"])
    assert s["profile_regret_max"] == pytest.approx(0.4)
    assert s["profile_picked_worst"] == 1
    good = runs.assign(profile=runs["builder"].map({"AllReduce": 3, "PS": 1, "Gossip": 2}))
    _, s = score_rounds(good, ["profile"])
    assert s["profile_regret_max"] == 0.0 and s["profile_picked_worst"] == 0


def test_too_few_rounds_are_flagged_and_bad_tables_are_one_clear_error():
    _, s = score_rounds(_runs({"AllReduce": [100, 101]}, {"AllReduce": 100}), ["profile"])
    assert not s["rounds_enough"]
    with pytest.raises(DistlabError, match="lack the columns"):
        score_rounds(_runs({"AllReduce": [1.0]}, {"AllReduce": 1.0}), ["measured_step"])
    with pytest.raises(DistlabError, match="not positive"):
        score_rounds(_runs({"AllReduce": [0.0, 1.0]}, {"AllReduce": 1.0}), ["profile"])


def test_a_checkpoints_share_of_a_run_is_the_time_its_steps_added_within_the_run():
    from types import SimpleNamespace

    from distlab.bench.ddp import checkpoint_share, run_span_throughput

    # rank 0's 20 steps of 1.0 s; the checkpoint after 12 steps: its snapshot adds 0.3 s to step 12
    # and its writer 0.2 s to steps 13 and 14; rank 1's steps never count
    took = [1.0] * 20
    took[12] += 0.3
    took[13] += 0.2
    took[14] += 0.2
    ends = [sum(took[: i + 1]) for i in range(20)]
    rows = [{"rank": 0, "step": i, "wall_time": ends[i], "samples": 64 * (i + 1)} for i in range(20)]
    rows += [{"rank": 1, "step": i, "wall_time": 9.0 * i, "samples": 64 * (i + 1)} for i in range(20)]
    run = SimpleNamespace(metrics=pd.DataFrame(rows), last_checkpoint={"step": 12})
    span = ends[-1] - ends[3]  # warm-up 4: the span run_span_throughput times
    assert run_span_throughput(run, 4) == pytest.approx(64 * 16 / span)
    assert checkpoint_share(run, 4) == pytest.approx(0.7 / span)
    # none taken, or taken before the span or at the run's end: no share to measure
    for last in (None, {"step": 2}, {"step": 20}):
        assert checkpoint_share(SimpleNamespace(metrics=run.metrics, last_checkpoint=last), 4) is None
