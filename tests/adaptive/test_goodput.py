"""Goodput and AdaScale against hand computations and a simulated noisy gradient."""

import numpy as np
import pytest

from distlab.adaptive import (
    GradientStats,
    adascale_gain,
    best_batch,
    estimate_gradient_stats,
    goodput,
    optimal_batch,
    statistical_efficiency,
)
from distlab.errors import DistlabError


def test_gradient_stats_recovered_from_sampled_minibatch_gradients():
    rng = np.random.default_rng(0)
    mu = rng.normal(size=50) * 0.1  # true gradient, |G|^2 ~ 0.5
    sigma = 1.0  # per-sample noise per coordinate: tr(Sigma) = 50

    def sqnorm(b: int) -> float:
        g = mu + rng.normal(scale=sigma, size=(4000, 50)).reshape(4000, 50) / np.sqrt(b)
        return float(np.mean(np.sum(g * g, axis=1)))

    stats = estimate_gradient_stats(8, sqnorm(8), 128, sqnorm(128))
    assert stats.sqr == pytest.approx(float(mu @ mu), rel=0.15)
    assert stats.var == pytest.approx(50.0, rel=0.05)
    assert stats.noise_scale == pytest.approx(50.0 / float(mu @ mu), rel=0.2)


def test_efficiency_and_goodput_hand_values():
    assert statistical_efficiency(32, noise_scale=100, base_batch=32) == 1.0
    assert statistical_efficiency(132, noise_scale=100, base_batch=32) == pytest.approx(132 / 232)
    assert goodput(1000.0, 132, 100, 32) == pytest.approx(1000 * 132 / 232)


def test_adascale_gain_limits():
    pure_signal = GradientStats(sqr=1.0, var=0.0)
    pure_noise = GradientStats(sqr=1e-12, var=1.0)
    assert adascale_gain(pure_signal, 8, 32) == pytest.approx(1.0)
    assert adascale_gain(pure_noise, 8, 32) == pytest.approx(8.0, rel=1e-6)


def test_adascale_gain_takes_the_base_batch_variance_from_the_per_sample_trace():
    # the base-batch variance sigma^2 = tr(Sigma) / M0 = 48 / 16 = 3, |G|^2 = 1, scale 3: (3 + 1) / (1 + 1)
    assert adascale_gain(GradientStats(sqr=1.0, var=48.0), 3, 16) == pytest.approx(2.0)
    assert GradientStats(sqr=1.0, var=48.0).batch_variance(16) == 3.0


def test_efficiency_at_noise_scale_64_from_base_batch_16():
    got = statistical_efficiency(np.array([16, 32, 64, 128, 256]), noise_scale=64, base_batch=16)
    np.testing.assert_allclose(got, [1, 0.8333, 0.625, 0.4167, 0.25], atol=1e-4)


def test_the_goodput_optimal_batch_of_a_linear_step_time_is_sqrt_a_phi_over_b():
    a, b, phi = 0.02, 1e-4, 64.0
    batches = np.arange(1, 4000)
    measured = batches[np.argmax(batches / (a + b * batches) * statistical_efficiency(batches, phi, 1))]
    assert optimal_batch(a, b, phi) == pytest.approx((a * phi / b) ** 0.5)
    assert measured == pytest.approx(optimal_batch(a, b, phi), abs=1)
    assert optimal_batch(a, b, phi, lo=1, hi=64) == 64  # within the bounds


def test_best_batch_trades_throughput_for_efficiency():
    # throughput saturates: 1000 * b / (b + 64); with noise scale 256 the optimum is interior
    batch, gp = best_batch(lambda b: 1000 * b / (b + 64), [32, 64, 128, 256, 512, 1024, 4096], 256, 32)
    assert batch in (128, 256)
    assert gp == max(goodput(1000 * b / (b + 64), b, 256, 32) for b in [32, 64, 128, 256, 512, 1024, 4096])


@pytest.mark.parametrize(
    "call",
    [
        lambda: estimate_gradient_stats(64, 1.0, 32, 1.0),
        lambda: statistical_efficiency(0, 1, 1),
        lambda: adascale_gain(GradientStats(1, 1), 0.5, 16),
        lambda: optimal_batch(0.1, 1e-3, 64, lo=128, hi=64),
        lambda: best_batch(lambda b: 1.0, [], 1, 1),
    ],
)
def test_bad_input_is_a_distlab_error(call):
    with pytest.raises(DistlabError):
        call()
