"""Parallax: sparse or embedding variables on load-balanced parameter servers, dense ones all-reduced."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.strategy.builders._common import Loads, Servers, assemble, check_chunk, pick_servers
from distlab.strategy.builders._registry import register
from distlab.strategy.types import Strategy, Sync, VariablePlan

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec


@register("Parallax")
def build_parallax(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    chunk_size: int = 128,
    servers: Servers = "first",
    batch_size: int | None = None,
) -> Strategy:
    """Dense: ``allreduce`` with ``group = index // chunk_size`` (index over all variables); sparse/embedding:
    PS."""
    check_chunk("Parallax", chunk_size)
    chosen = pick_servers("Parallax", resources, servers)
    loads = Loads(chosen)
    plans, used_ps = [], False
    for i, v in enumerate(profile.variables):
        if v.sparse or v.embedding:
            sync = Sync("ps", server=loads.add(loads.least(), v.nbytes))
            used_ps = True
        else:
            sync = Sync("allreduce", group=i // chunk_size)
        plans.append(VariablePlan(v.name, sync=sync))
    return assemble(
        "Parallax", profile, resources, plans, servers=chosen if used_ps else (), batch_size=batch_size
    )
