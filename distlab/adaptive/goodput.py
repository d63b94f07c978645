"""Goodput (AdaptDL/Pollux): throughput times statistical efficiency from the gradient noise scale.

References: McCandlish et al. 2018, "An Empirical Model of Large-Batch Training" (gradient
noise scale); Qiao et al. 2021, "Pollux" (statistical efficiency and goodput); Johnson et al.
2020, "AdaScale SGD" (learning-rate gain).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from distlab.errors import DistlabError


@dataclass(frozen=True)
class GradientStats:
    """``sqr``: |G|^2, the squared norm of the true (expected) gradient; ``var``: tr(Sigma), the
    trace of the covariance of ONE sample's gradient (per-sample variance). A gradient averaged
    over a batch of M samples has variance tr(Sigma)/M."""

    sqr: float
    var: float

    @property
    def noise_scale(self) -> float:
        """phi = tr(Sigma) / |G|^2, in samples: the batch size where noise and signal balance."""
        return self.var / self.sqr if self.sqr > 0 else float("inf")

    def batch_variance(self, batch: float) -> float:
        """tr(Sigma) / ``batch``: the variance of a gradient averaged over ``batch`` samples."""
        if not batch > 0:
            raise DistlabError(f"GradientStats.batch_variance: batch must be > 0, got {batch!r}")
        return self.var / batch


def estimate_gradient_stats(
    small_batch: int, small_sqnorm: float, big_batch: int, big_sqnorm: float
) -> GradientStats:
    """Unbiased |G|^2 and tr(Sigma) from squared gradient norms at two batch sizes.

    E|G_B|^2 = |G|^2 + tr(Sigma)/B, so two batch sizes pin both (McCandlish et al. 2018, App. A.1).
    """
    from distlab.adaptive.noise import two_batch_estimates

    if not 0 < small_batch < big_batch:
        raise DistlabError(
            f"estimate_gradient_stats: need 0 < small_batch < big_batch, got {small_batch}, {big_batch}"
        )
    sqr, var = (float(x) for x in two_batch_estimates(small_batch, small_sqnorm, big_batch, big_sqnorm))
    return GradientStats(sqr=max(sqr, 1e-30), var=max(var, 0.0))


def statistical_efficiency(batch: ArrayLike, noise_scale: float, base_batch: float) -> Any:
    """Progress per sample at ``batch`` relative to ``base_batch`` (Pollux eq. 5): (phi + M0) / (phi + M).

    ``phi`` is the gradient noise scale: batches far below it scale perfectly, batches far above
    it waste samples. Capped at 1 (a batch below the base is not more than perfectly efficient).
    Works elementwise on arrays.
    """
    m = np.asarray(batch, dtype=float)
    if base_batch <= 0 or np.any(m <= 0):
        raise DistlabError(f"statistical_efficiency: batch sizes must be positive, got {batch}, {base_batch}")
    eff = np.minimum(1.0, (noise_scale + base_batch) / (noise_scale + m))
    return float(eff) if eff.ndim == 0 else eff


def adascale_gain(stats: GradientStats, scale: float, base_batch: float) -> float:
    """AdaScale's learning-rate gain r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2) for a global batch
    S times ``base_batch`` (samples), where sigma^2 = tr(Sigma) / base_batch is the variance of a
    base-batch gradient and mu^2 = |G|^2 (Johnson et al. 2020). 1 <= r <= S."""
    if scale < 1:
        raise DistlabError(f"adascale_gain: scale must be >= 1, got {scale}")
    sigma2 = stats.batch_variance(base_batch)
    return (sigma2 + stats.sqr) / (sigma2 / scale + stats.sqr)


def optimal_batch(a: float, b: float, noise_scale: float, lo: float = 1, hi: float = float("inf")) -> float:
    """The global batch M maximising goodput when a step takes ``a + b M`` seconds: goodput is
    proportional to M / (a + b M) / (phi + M), whose maximum is at M = sqrt(a phi / b); clipped
    to ``[lo, hi]`` (goodput rises below the optimum and falls above it)."""
    if a < 0 or b <= 0 or noise_scale < 0:
        raise DistlabError(
            f"optimal_batch: need a >= 0 s, b > 0 s per sample and a noise scale >= 0, got {a}, {b}, "
            f"{noise_scale}"
        )
    if lo > hi:
        raise DistlabError(f"optimal_batch: the bounds exclude every batch (lo {lo} > hi {hi})")
    return min(max((a * noise_scale / b) ** 0.5, lo), hi)


def goodput(throughput: ArrayLike, batch: ArrayLike, noise_scale: float, base_batch: float) -> Any:
    """Useful samples per second: throughput x statistical efficiency (elementwise on arrays)."""
    return np.asarray(throughput, dtype=float) * statistical_efficiency(batch, noise_scale, base_batch)


def best_batch(
    throughput_at: Callable[[int], float], batches: Iterable[int], noise_scale: float, base_batch: int
) -> tuple[int, float]:
    """The global batch size (of ``batches``) with the highest goodput, and that goodput."""
    best: tuple[int, float] | None = None
    for b in batches:
        g = float(goodput(throughput_at(b), b, noise_scale, base_batch))
        if best is None or g > best[1]:
            best = (b, g)
    if best is None:
        raise DistlabError("best_batch: no batch sizes to choose from")
    return best
