"""RandomAxisPartitionAR: each variable split along a randomly drawn axis, every shard all-reduced."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from distlab.errors import StrategyError
from distlab.strategy.builders._common import assemble, check_chunk, smallest_divisor
from distlab.strategy.builders._registry import register
from distlab.strategy.builders.partitioned_ar import plan_ar_shards
from distlab.strategy.types import Partition, Strategy

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec


@register("RandomAxisPartitionAR")
def build_random_axis_partition_ar(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    chunk_size: int = 128,
    seed: int = 0,
    batch_size: int | None = None,
) -> Strategy:
    """Axis drawn uniformly among dimensions of size > 1 (axis 0 for embeddings); same seed, same strategy.

    Shard count = smallest divisor >= 2 of the drawn dimension; groups as PartitionedAR.
    """
    check_chunk("RandomAxisPartitionAR", chunk_size)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise StrategyError(f"RandomAxisPartitionAR: seed must be an integer, got {seed!r}")
    rng = random.Random(seed)
    plans, counter = [], 0
    for v in profile.variables:
        if v.embedding or v.sparse:
            axes = [0] if v.shape and v.shape[0] > 1 else []
        else:
            axes = [a for a, d in enumerate(v.shape) if d > 1]
        part = None
        if axes:
            axis = axes[rng.randrange(len(axes))]
            part = Partition(axis, smallest_divisor(v.shape[axis]))
        plan, counter = plan_ar_shards(v, part, counter, chunk_size)
        plans.append(plan)
    return assemble("RandomAxisPartitionAR", profile, resources, plans, batch_size=batch_size)
