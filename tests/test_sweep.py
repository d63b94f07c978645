"""Scoring a measured grid: MAPE, noise floor, Spearman, regret, leave-one-world-out."""

import numpy as np
import pandas as pd
import pytest

from distlab.sweep import accuracy, leave_one_world_out


def grid(pred_scale: dict[str, float]) -> pd.DataFrame:
    rows = []
    for world in (1, 2):
        for strategy, measured in (("A", 100.0), ("B", 80.0), ("C", 50.0)):
            for rep, jitter in enumerate((0.98, 1.02)):
                rows.append({"model": "m", "strategy": strategy, "builder": strategy, "world": world, "batch": 8,
                             "repeat": rep, "predicted_throughput": measured * pred_scale[strategy],
                             "measured_throughput": measured * world * jitter, "predicted_step_time": 0.1,
                             "measured_step_time": 0.1, "grad_bytes": 1e6})
    return pd.DataFrame(rows)


def test_accuracy_hand_figures():
    df = grid({"A": 1.1, "B": 1.0, "C": 0.9})
    per, s = accuracy(df[df.world == 1])
    assert s["mape"] == pytest.approx((0.1 + 0.0 + 0.1) / 3)
    assert s["max_error"] == pytest.approx(0.1)
    assert s["noise_floor"] == pytest.approx(0.02)
    assert s["spearman_median"] == pytest.approx(1.0)
    assert s["regret_median"] == 0.0
    assert len(per) == 3


def test_noise_floor_is_the_median_relative_difference_of_pairs_of_repeats():
    # repeats 0.9, 1.0, 1.1 of every configuration: pairs differ by 0.1/1.9, 0.1/2.1 and 0.2/2.0
    rows = [
        {"model": "m", "strategy": st, "world": 1, "batch": 8, "repeat": rep,
         "predicted_throughput": 100.0, "measured_throughput": 100.0 * f}
        for st in ("A", "B", "C") for rep, f in enumerate((0.9, 1.0, 1.1))
    ]
    df = pd.DataFrame(rows)
    _, three = accuracy(df)
    assert three["noise_floor"] == pytest.approx(0.1 / 1.9)
    _, two = accuracy(df[df.repeat != 1])  # 0.9 and 1.1: each 0.1 from their median of 1.0
    assert two["noise_floor"] == pytest.approx(0.1)


def test_a_wrong_ranking_shows_as_regret_and_low_spearman():
    df = grid({"A": 0.5, "B": 1.0, "C": 3.0})  # predicts C best, which is measured worst
    _, s = accuracy(df[df.world == 1])
    assert s["regret_median"] == pytest.approx(0.5)
    assert s["spearman_median"] == pytest.approx(-1.0)


def test_regret_of_a_tie_is_the_mean_over_the_tied_strategies():
    # A and C predicted alike (the same work to the model): picking one of them at random loses
    # (0 + 0.5) / 2 of the best; taking the first of the tie would say 0 here, 0.5 with C first
    df = grid({"A": 1.0, "B": 0.5, "C": 2.0})
    df.loc[df.strategy == "A", "predicted_throughput"] = 100.0
    df.loc[df.strategy == "C", "predicted_throughput"] = 100.0
    _, s = accuracy(df[df.world == 1])
    assert s["regret_median"] == pytest.approx(0.25)
    assert s["regret_first_max"] == pytest.approx(0.0)
    _, s = accuracy(df[df.world == 1].iloc[::-1])
    assert s["regret_median"] == pytest.approx(0.25)


def test_leave_one_world_out_recovers_a_structural_model():
    # step time = compute linear in batch + ring all-reduce comm, which grows with world
    rows = []
    for world in (1, 2, 3, 4):
        for batch in (8, 32):
            comm = 0 if world == 1 else 2 * (world - 1) * 1e-4 + 2 * (world - 1) / world * 4e6 / 1e9
            t = 1e-3 * batch + comm
            rows.append({"model": "m", "builder": "AllReduce", "world": world, "batch": batch,
                         "measured_step_time": t, "grad_bytes": 4e6})
    errs = leave_one_world_out(pd.DataFrame(rows))
    assert set(errs) >= {"m_w3", "m_w4"}
    assert errs["m_w4"] < 0.1 and np.isfinite(list(errs.values())).all()
