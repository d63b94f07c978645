"""AllReduce: every dense variable all-reduced in groups of ``chunk_size``; sparse ones all-gathered."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.strategy.builders._common import assemble, check_chunk, check_compressor
from distlab.strategy.builders._registry import register
from distlab.strategy.types import Strategy, Sync, VariablePlan

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec


@register("AllReduce")
def build_allreduce(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    chunk_size: int = 128,
    compressor: str = "none",
    batch_size: int | None = None,
) -> Strategy:
    """``group = index // chunk_size`` over all variables in profile order (AutoDist ``AllReduce``)."""
    check_chunk("AllReduce", chunk_size)
    check_compressor("AllReduce", compressor)
    plans = []
    for i, v in enumerate(profile.variables):
        sync = (
            Sync("allgather") if v.sparse else Sync("allreduce", group=i // chunk_size, compressor=compressor)
        )
        plans.append(VariablePlan(v.name, sync=sync))
    return assemble("AllReduce", profile, resources, plans, batch_size=batch_size)
