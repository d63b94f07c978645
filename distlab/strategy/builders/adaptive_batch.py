"""AdaptiveBatch: any builder's plan with AdaptDL's adaptive batch size and learning-rate scaling."""

from __future__ import annotations

import dataclasses
from typing import Any

from distlab.errors import StrategyError
from distlab.strategy.builders._registry import build, register
from distlab.strategy.types import LR_SCALING, BatchConfig, Strategy


@register("AdaptiveBatch")
def build_adaptive_batch(
    profile: Any,
    resources: Any,
    *,
    base: str = "AllReduce",
    lr_scaling: str = "adascale",
    accumulation: int = 1,
    batch_size: int | None = None,
    **base_options: Any,
) -> Strategy:
    """The ``base`` builder's strategy with ``batch.lr_scaling`` set (AdaScale by default, as in AdaptDL).

    Extra options go to the base builder. The batch size is where adaptation starts; the
    runtime's goodput controller (Pollux/AdaptDL) moves it and rescales the learning rate.
    """
    if base == "AdaptiveBatch":
        raise StrategyError("AdaptiveBatch: base cannot be AdaptiveBatch itself")
    if lr_scaling not in LR_SCALING:
        raise StrategyError(
            f"AdaptiveBatch: lr_scaling {lr_scaling!r} is not one of: {', '.join(LR_SCALING)}"
        )
    if not isinstance(accumulation, int) or isinstance(accumulation, bool) or accumulation < 1:
        raise StrategyError(f"AdaptiveBatch: accumulation must be a positive integer, got {accumulation!r}")
    inner = build(base, profile, resources, batch_size=batch_size, **base_options)
    batch = BatchConfig(inner.batch.per_replica, accumulation, lr_scaling)
    return dataclasses.replace(inner, batch=batch)
