"""Adaptive batch size (AdaptDL): gradient noise scale, statistical efficiency, goodput, AdaScale."""

from distlab.adaptive.goodput import (
    GradientStats,
    adascale_gain,
    best_batch,
    estimate_gradient_stats,
    goodput,
    optimal_batch,
    statistical_efficiency,
)

__all__ = [
    "GradientStats",
    "adascale_gain",
    "best_batch",
    "estimate_gradient_stats",
    "goodput",
    "optimal_batch",
    "statistical_efficiency",
]
