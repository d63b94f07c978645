"""The gradient noise scale, estimated from squared gradient norms at two batch sizes each step.

Per optimizer step the runtime measures, per parameter group, the mean squared norm of gradients
averaged over ``small`` samples and the squared norm of one averaged over ``big`` samples (the
pairs it has: each rank's local gradient and the all-reduced one; or, on one rank, the
micro-batches and their sum; or two consecutive steps). Since E|g_M|^2 = |G|^2 + tr(Sigma)/M,
each pair gives unbiased estimates of |G|^2 and of the per-sample tr(Sigma) (McCandlish et al.
2018, appendix A.1). Single-step estimates are very noisy (|G|^2 is a small difference of large
numbers), so both are smoothed by a bias-corrected exponential moving average, and the noise
scale is the ratio of the averages (as AdaptDL does). A step of a global batch ``scale`` times the
base batch counts as ``scale`` base steps (decay ``smoothing ** scale``, AdaptDL's form): the
average spans about the same number of samples at any batch size.

Units: ``sqr`` is |G|^2 (squared gradient units), ``var`` is tr(Sigma) for one sample, the noise
scale phi = var / sqr is in samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distlab.adaptive.goodput import GradientStats
from distlab.errors import DistlabError

SMOOTHING = 0.999  # AdaptDL's default: an average over the last ~1,000 base-batch steps' samples


def two_batch_estimates(
    small: float | np.ndarray,
    small_sqr: float | np.ndarray,
    big: float | np.ndarray,
    big_sqr: float | np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Unbiased (|G|^2, per-sample tr(Sigma)) per group from mean squared norms at ``small`` and
    ``big`` samples (``small < big``); may be negative for one step, unlike their averages."""
    small, big = np.asarray(small, dtype=float), np.asarray(big, dtype=float)
    if np.any(small <= 0) or np.any(big <= small):
        raise DistlabError(f"noise scale: need 0 < small batch < big batch, got {small}, {big}")
    s, b = np.asarray(small_sqr, dtype=float), np.asarray(big_sqr, dtype=float)
    sqr = (big * b - small * s) / (big - small)
    var = (s - b) / (1.0 / small - 1.0 / big)
    return sqr, var


@dataclass
class NoiseScale:
    """Moving averages of |G|^2 and tr(Sigma) per parameter group (a state that checkpoints)."""

    groups: int = 1
    smoothing: float = SMOOTHING
    sqr_avg: np.ndarray = field(default=None)  # type: ignore[assignment]
    var_avg: np.ndarray = field(default=None)  # type: ignore[assignment]
    weight: float = 0.0  # 1 - smoothing ** updates: the bias correction
    updates: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.smoothing < 1:
            raise DistlabError(f"NoiseScale.smoothing: must be in [0, 1), got {self.smoothing!r}")
        if self.sqr_avg is None:
            self.sqr_avg = np.zeros(self.groups)
        if self.var_avg is None:
            self.var_avg = np.zeros(self.groups)

    def update(
        self, small: float, small_sqr: np.ndarray, big: float, big_sqr: np.ndarray, scale: float = 1.0
    ) -> None:
        """One step's squared norms (per group) at ``small`` and ``big`` samples; the step's global
        batch is ``scale`` base batches."""
        sqr, var = two_batch_estimates(small, small_sqr, big, big_sqr)
        a = self.smoothing ** max(float(scale), 1.0)
        self.sqr_avg = a * self.sqr_avg + (1 - a) * sqr
        self.var_avg = a * self.var_avg + (1 - a) * var
        self.weight = a * self.weight + (1 - a)
        self.updates += 1

    def stats(self, group: int | None = None) -> GradientStats | None:
        """The bias-corrected averages of one group (None: summed over groups); None before any update."""
        if not self.updates:
            return None
        sqr = self.sqr_avg.sum() if group is None else self.sqr_avg[group]
        var = self.var_avg.sum() if group is None else self.var_avg[group]
        return GradientStats(sqr=max(float(sqr) / self.weight, 1e-30), var=max(float(var) / self.weight, 0.0))

    @property
    def noise_scale(self) -> float | None:
        """phi = tr(Sigma) / |G|^2 over every group, in samples (None before any update)."""
        s = self.stats()
        return None if s is None else s.noise_scale

    def to_dict(self) -> dict[str, object]:
        return {
            "groups": self.groups,
            "smoothing": self.smoothing,
            "sqr_avg": self.sqr_avg.tolist(),
            "var_avg": self.var_avg.tolist(),
            "weight": self.weight,
            "updates": self.updates,
        }

    @classmethod
    def from_dict(cls, d: dict) -> NoiseScale:
        return cls(
            int(d["groups"]),
            float(d["smoothing"]),
            np.asarray(d["sqr_avg"], dtype=float),
            np.asarray(d["var_avg"], dtype=float),
            float(d["weight"]),
            int(d["updates"]),
        )
