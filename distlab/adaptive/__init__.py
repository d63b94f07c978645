"""Adaptive batch size (AdaptDL): gradient noise scale, statistical efficiency, goodput, AdaScale.

Pure planning (no torch, no Dask): ``goodput`` the statistical efficiency and goodput formulas,
``noise`` the gradient noise scale from two batch sizes, ``controller`` the batch-size controller a
rank runs, ``scaling`` the learning-rate rules, ``quadratic`` a toy problem the tests train.
Measuring a model's noise scale in this process is ``runtime/noise_probe.py``; the builder and its
bounds are ``strategy/builders/adaptive_batch.py``.
"""

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
