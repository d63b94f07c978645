"""Scoring a measured grid: MAPE, noise floor, Spearman, regret, leave-one-world-out."""

import numpy as np
import pandas as pd
import pytest

from distlab.costmodel.scoring import accuracy, leave_one_world_out


def grid(pred_scale: dict[str, float]) -> pd.DataFrame:
    rows = []
    for world in (1, 2):
        for strategy, measured in (("A", 100.0), ("B", 80.0), ("C", 50.0)):
            for rep, jitter in enumerate((0.98, 1.02)):
                rows.append(
                    {
                        "model": "m",
                        "strategy": strategy,
                        "builder": strategy,
                        "world": world,
                        "batch": 8,
                        "repeat": rep,
                        "predicted_throughput": measured * pred_scale[strategy],
                        "measured_throughput": measured * world * jitter,
                        "predicted_step_time": 0.1,
                        "measured_step_time": 0.1,
                        "grad_bytes": 1e6,
                    }
                )
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
        {
            "model": "m",
            "strategy": st,
            "world": 1,
            "batch": 8,
            "repeat": rep,
            "predicted_throughput": 100.0,
            "measured_throughput": 100.0 * f,
        }
        for st in ("A", "B", "C")
        for rep, f in enumerate((0.9, 1.0, 1.1))
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
            rows.append(
                {
                    "model": "m",
                    "builder": "AllReduce",
                    "world": world,
                    "batch": batch,
                    "measured_step_time": t,
                    "grad_bytes": 4e6,
                }
            )
    errs = leave_one_world_out(pd.DataFrame(rows))
    assert set(errs) >= {"m_w3", "m_w4"}
    assert errs["m_w4"] < 0.1 and np.isfinite(list(errs.values())).all()


def noisy_grid(
    truths: list[float], noise: float, repeats: int, seed: int = 0, models: int = 1
) -> pd.DataFrame:
    """``models`` models at one world size, batch 8: each strategy's runs its truth times lognormal noise."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "model": f"m{m}",
            "strategy": f"S{i}",
            "world": 2,
            "batch": 8,
            "repeat": rep,
            "predicted_throughput": 1.0,
            "measured_throughput": t * float(np.exp(rng.normal(0.0, noise))),
        }
        for m in range(models)
        for i, t in enumerate(truths)
        for rep in range(repeats)
    )


def test_noise_ceiling_of_noiseless_runs_is_a_perfect_score():
    df = grid({"A": 1.0, "B": 1.0, "C": 1.0})
    df["measured_throughput"] = df["measured_throughput"].round(-1)  # both repeats alike
    from distlab.costmodel.scoring import noise_ceiling

    c = noise_ceiling(df, draws=5)
    assert c["ceiling_mape"] == 0.0 and c["ceiling_regret_max"] == 0.0
    assert c["ceiling_spearman_min"] == pytest.approx(1.0)
    assert c["ceiling_share_spearman_min_met"] == c["ceiling_share_regret_max_met"] == 1.0


def test_noise_ceiling_tells_apart_strategies_far_apart_but_not_within_the_noise():
    from distlab.costmodel.scoring import noise_ceiling

    # truths a factor 1.5 apart, 2% noise: a perfect predictor ranks and picks right every draw
    apart = noise_ceiling(noisy_grid([100.0, 150.0, 225.0, 337.5], 0.02, 3), draws=50)
    assert apart["ceiling_spearman_min"] == pytest.approx(1.0) and apart["ceiling_regret_max"] == 0.0
    assert apart["ceiling_share_spearman_min_met"] == 1.0
    # truths 1% apart, 15% noise, eight models: the measurements cannot show even a perfect
    # predictor right at every one
    close = noise_ceiling(noisy_grid([100.0, 101.0, 102.0, 103.0, 104.0], 0.15, 3, models=8), draws=50)
    assert close["ceiling_spearman_min"] < 0.9 and close["ceiling_regret_max"] > 0.05
    assert close["ceiling_share_spearman_min_met"] < 0.5 and close["ceiling_share_regret_max_met"] < 0.5
    assert 0.03 < close["ceiling_mape"] < 0.3


def test_noise_ceiling_falls_with_more_repeats():
    from distlab.costmodel.scoring import noise_ceiling

    df = noisy_grid([100.0, 110.0, 120.0, 130.0, 140.0], 0.1, 3)
    one, many = (noise_ceiling(df, draws=40, repeats=r) for r in (1, 15))
    assert many["ceiling_mape"] < 0.5 * one["ceiling_mape"]
    assert many["ceiling_spearman_min"] > one["ceiling_spearman_min"]


def test_noise_ceiling_names_what_it_needs():
    from distlab.costmodel.scoring import noise_ceiling
    from distlab.errors import DistlabError

    df = noisy_grid([100.0, 110.0, 120.0], 0.1, 3)
    with pytest.raises(DistlabError, match="repeats >= 2"):
        noise_ceiling(df[df.repeat == 0])
    with pytest.raises(DistlabError, match="draws must be an integer >= 1, got 0"):
        noise_ceiling(df, draws=0)
    with pytest.raises(DistlabError, match=r"repeats \(None: as measured\) must be an integer >= 1, got 0"):
        noise_ceiling(df, repeats=0)
