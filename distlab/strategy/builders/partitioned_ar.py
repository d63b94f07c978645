"""PartitionedAR: PartitionedPS's shard rule, every shard all-reduced in groups of ``chunk_size``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distlab.strategy.builders._common import assemble, check_chunk, shard_counts
from distlab.strategy.builders._registry import register
from distlab.strategy.types import Partition, Strategy, Sync, VariablePlan

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec


def plan_ar_shards(v: Any, part: Partition | None, counter: int, chunk_size: int) -> tuple[VariablePlan, int]:
    """One variable's plan with each all-reduced shard in ``group = running counter // chunk_size``.

    Sparse variables' shards are all-gathered instead and do not advance the counter.
    An unsplit variable counts as one shard.
    """
    n = part.shards if part is not None else 1
    syncs = []
    for _ in range(n):
        if v.sparse:
            syncs.append(Sync("allgather"))
        else:
            syncs.append(Sync("allreduce", group=counter // chunk_size))
            counter += 1
    if part is None:
        return VariablePlan(v.name, sync=syncs[0]), counter
    return VariablePlan(v.name, partition=part, shards=tuple(syncs)), counter


@register("PartitionedAR")
def build_partitioned_ar(
    profile: ModelProfile, resources: ResourceSpec, *, chunk_size: int = 128, batch_size: int | None = None
) -> Strategy:
    """Split along axis 0 into the smallest divisor >= 2 of dimension 0 shards; all-reduce each shard."""
    check_chunk("PartitionedAR", chunk_size)
    plans, counter = [], 0
    for v in profile.variables:
        k = shard_counts(v, "even")
        plan, counter = plan_ar_shards(v, Partition(0, k) if k > 1 else None, counter, chunk_size)
        plans.append(plan)
    return assemble("PartitionedAR", profile, resources, plans, batch_size=batch_size)
