"""The goodput controller's choices against hand-computed optima, its hysteresis and its bounds."""

from __future__ import annotations

import pytest

import distlab as dl
from distlab.adaptive import optimal_batch, statistical_efficiency
from distlab.adaptive.controller import MIN_UPDATES, GoodputController
from distlab.errors import StrategyError
from distlab.strategy.builders.adaptive_batch import Bounds

A, B, PHI, WORLD = 0.05, 2e-4, 64.0, 2  # step time a + b M; the optimum sqrt(a phi / b) = 126.5


def linear_table(bounds: Bounds) -> dict:
    return {(b, k): A + B * b * k * WORLD for b, k in bounds.configurations(WORLD)}


def test_the_choice_is_the_goodput_optimum_of_a_linear_step_time():
    bounds = Bounds((4, 128), max_accumulation=2)
    ctl = GoodputController(linear_table(bounds), WORLD, base_batch=4)
    choice = ctl.decide((4, 1), PHI, MIN_UPDATES)
    m = choice[0] * choice[1] * WORLD
    best = max(
        {b * k * WORLD for b, k in bounds.configurations(WORLD)},
        key=lambda m: m / (A + B * m) * statistical_efficiency(m, PHI, 4),
    )
    assert m == best == 128  # of the allowed batches (powers of two), the one nearest sqrt(a phi / b)
    assert optimal_batch(A, B, PHI) == pytest.approx(126.5, abs=0.1)
    assert choice == (64, 1)  # the same global batch without accumulation is preferred


def test_no_decision_before_the_noise_scale_settles_and_none_within_the_hysteresis():
    bounds = Bounds((4, 128), max_accumulation=2)
    ctl = GoodputController(linear_table(bounds), WORLD, base_batch=4)
    assert ctl.decide((4, 1), PHI, MIN_UPDATES - 1) == (4, 1)
    assert ctl.decide((4, 1), None, 1000) == (4, 1)
    near = (32, 1)  # M = 64: within 5% of the best goodput? then it stays
    g_near, g_best = ctl.goodput(near, PHI), ctl.goodput((64, 1), PHI)
    assert (ctl.decide(near, PHI, MIN_UPDATES) == near) == (g_best <= 1.05 * g_near)


def test_measured_step_times_replace_the_prediction_and_rescale_the_rest():
    bounds = Bounds((4, 128))
    ctl = GoodputController(linear_table(bounds), WORLD, base_batch=4)
    for _ in range(3):
        ctl.observe((4, 1), 2 * ctl.step_table[(4, 1)])  # this cluster is twice as slow as predicted
    assert ctl.step_time((4, 1)) == pytest.approx(2 * ctl.step_table[(4, 1)])
    assert ctl.step_time((64, 1)) == pytest.approx(2 * ctl.step_table[(64, 1)])


def test_bounds_that_exclude_every_batch_are_one_error_naming_the_fields():
    with pytest.raises(
        StrategyError,
        match=r"max_batch_size 8 excludes every batch: the smallest is local_bsz_bounds\[0\] x 2 ranks = 16",
    ):
        Bounds((8, 64), 1, 8).check(2)
    with pytest.raises(StrategyError, match=r"local_bsz_bounds must be two integers 1 <= lo <= hi"):
        Bounds((64, 8)).check(2)
    res = dl.ResourceSpec.local(2)
    prof = dl.profile(dl.zoo.get("mlp"), batch_size=16)
    with pytest.raises(StrategyError, match=r"starting batch 16 is outside local_bsz_bounds \(32, 64\)"):
        dl.strategy.build("AdaptiveBatch", prof, res, local_bsz_bounds=(32, 64))
    with pytest.raises(StrategyError, match="max_batch_size 4 excludes every batch"):
        dl.strategy.build("AdaptiveBatch", prof, res, max_batch_size=4)
    st = dl.strategy.build("AdaptiveBatch", prof, res, max_batch_size=256)
    from distlab.strategy.builders.adaptive_batch import adaptive_bounds

    assert adaptive_bounds(st) == Bounds((16, 128), 4, 256)
    assert all(b * k * 2 <= 256 for b, k in adaptive_bounds(st).configurations(2))


def test_an_adaptive_batch_over_parameter_servers_with_adam_says_what_its_noise_leaves_out():
    """runtime/noise.py leaves Adam's server-held variables out of the live noise scale: a launch
    that would measure no noise at all says so before it starts; SGD or a replicated base does not."""
    import warnings

    from distlab.costmodel import CostModel
    from distlab.runs.adaptive import adaptive_options

    res = dl.ResourceSpec.local(2)
    prof = dl.profile(dl.zoo.get("mlp"), batch_size=16)
    ps = dl.strategy.build("AdaptiveBatch", prof, res, base="PS")
    with pytest.warns(UserWarning, match="adapts to no measured noise at all; optimizer='sgd'"):
        assert adaptive_options(CostModel.default(), prof, res, ps, 16, "adam")["adaptive"]["table"]
    replicated = dl.strategy.build("AdaptiveBatch", prof, res)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adaptive_options(CostModel.default(), prof, res, ps, 16, "sgd")
        adaptive_options(CostModel.default(), prof, res, replicated, 16, "adam")
