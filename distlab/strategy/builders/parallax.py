"""Parallax: sparse or embedding variables on load-balanced parameter servers, dense ones all-reduced."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.errors import StrategyError
from distlab.strategy.builders._common import (
    Loads,
    Servers,
    assemble,
    check_chunk,
    consistency,
    pick_servers,
)
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
    sync: bool = True,
    staleness: int = 0,
    local_replication: bool = False,
) -> Strategy:
    """Dense: ``allreduce`` with ``group = index // chunk_size`` (index over all variables); sparse/embedding:
    PS, with the consistency options as ``PS`` (``local_replication`` needs a PS variable)."""
    check_chunk("Parallax", chunk_size)
    ps = consistency("Parallax", sync, staleness, local_replication)
    chosen = pick_servers("Parallax", resources, servers)
    loads = Loads(chosen)
    plans, used_ps = [], False
    for i, v in enumerate(profile.variables):
        if v.sparse or v.embedding:
            plan = Sync("ps", server=loads.add(loads.least(), v.nbytes), **ps)
            used_ps = True
        else:
            plan = Sync("allreduce", group=i // chunk_size)
        plans.append(VariablePlan(v.name, sync=plan))
    if not used_ps and (local_replication or (sync, staleness) != (True, 0)):
        option = "local_replication" if local_replication else "staleness" if staleness else "sync"
        raise StrategyError(
            f"Parallax: {option} applies to PS variables and profile {profile.name!r} has none (no sparse "
            "or embedding variable; its dense ones are all-reduced); drop the option, or use PS"
        )
    return assemble(
        "Parallax", profile, resources, plans, servers=chosen if used_ps else (), batch_size=batch_size
    )
