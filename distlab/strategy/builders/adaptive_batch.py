"""AdaptiveBatch: any builder's plan with AdaptDL's adaptive batch size and learning-rate scaling."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distlab.errors import StrategyError, check_positive
from distlab.strategy.builders._registry import build, register
from distlab.strategy.types import LR_SCALING, BatchConfig, Strategy

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec

MAX_ACCUMULATION = 4  # the builder's default


@register("AdaptiveBatch")
def build_adaptive_batch(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    base: str = "AllReduce",
    lr_scaling: str = "adascale",
    accumulation: int = 1,
    batch_size: int | None = None,
    local_bsz_bounds: tuple[int, int] | None = None,
    max_batch_size: int | None = None,
    max_accumulation: int = MAX_ACCUMULATION,
    **base_options: Any,
) -> Strategy:
    """The ``base`` builder's strategy, trained with an adaptive batch (AdaptDL/Pollux).

    The run measures its gradient noise scale live and, at each epoch boundary, its goodput
    controller (``distlab.adaptive.controller``) picks the per-replica batch (within
    ``local_bsz_bounds``, default: the starting batch to 8 times it) and the micro-batches per
    step (up to ``max_accumulation``) with the best goodput, the global batch at most
    ``max_batch_size``; the learning rate follows ``lr_scaling`` (AdaScale by default). Extra
    options go to the base builder. ``batch_size`` and ``accumulation`` are where it starts.
    """
    if base == "AdaptiveBatch":
        raise StrategyError("AdaptiveBatch: base cannot be AdaptiveBatch itself")
    if lr_scaling not in LR_SCALING:
        raise StrategyError(
            f"AdaptiveBatch: lr_scaling {lr_scaling!r} is not one of: {', '.join(LR_SCALING)}"
        )
    check_positive("AdaptiveBatch: accumulation", accumulation, StrategyError)
    inner = build(base, profile, resources, batch_size=batch_size, **base_options)
    b = inner.batch.per_replica
    lo, hi = (b, 8 * b) if local_bsz_bounds is None else tuple(local_bsz_bounds)
    Bounds((lo, hi), max_accumulation, max_batch_size).check(inner.world)
    if not lo <= b <= hi:
        raise StrategyError(
            f"AdaptiveBatch: the starting batch {b} is outside local_bsz_bounds ({lo}, {hi}); give a "
            "batch_size inside them or wider bounds"
        )
    return dataclasses.replace(inner, batch=BatchConfig(b, accumulation, lr_scaling))


def adaptive_bounds(strategy: Strategy) -> Any:
    """The controller's bounds of an AdaptiveBatch strategy, from its recorded options and its
    starting batch (None: not an adaptive strategy, its batch is fixed)."""
    if strategy.builder != "AdaptiveBatch":
        return None
    o, b = strategy.options, strategy.batch.per_replica
    lo, hi = o.get("local_bsz_bounds") or (b, 8 * b)
    return Bounds(
        (int(lo), int(hi)), int(o.get("max_accumulation", MAX_ACCUMULATION)), o.get("max_batch_size")
    )


@dataclass(frozen=True)
class Bounds:
    """What the controller may choose: per-replica batches ``per_replica`` (lo, hi), micro-batches
    per step up to ``max_accumulation``, a global batch of at most ``max_global`` samples."""

    per_replica: tuple[int, int]
    max_accumulation: int = 1
    max_global: int | None = None

    def check(self, world: int, where: str = "AdaptiveBatch") -> Bounds:
        lo, hi = self.per_replica
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
            raise StrategyError(
                f"{where}: local_bsz_bounds must be two integers 1 <= lo <= hi, got {self.per_replica!r}"
            )
        check_positive(f"{where}: max_accumulation", self.max_accumulation, StrategyError)
        if self.max_global is not None and self.max_global < lo * world:
            raise StrategyError(
                f"{where}: max_batch_size {self.max_global} excludes every batch: the smallest is "
                f"local_bsz_bounds[0] x {world} ranks = {lo * world}; raise max_batch_size or lower "
                "local_bsz_bounds"
            )
        return self

    def configurations(self, world: int) -> list[tuple[int, int]]:
        """Every allowed (per-replica batch, accumulation): powers of two within the bounds, and the
        bounds."""
        lo, hi = self.per_replica
        sizes = sorted({lo, hi, *(2**i for i in range(int(math.log2(hi)) + 1) if lo <= 2**i <= hi)})
        out = [
            (b, k)
            for b in sizes
            for k in range(1, self.max_accumulation + 1)
            if self.max_global is None or b * k * world <= self.max_global
        ]
        return out
