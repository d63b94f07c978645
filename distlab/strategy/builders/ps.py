"""Parameter-server builders: PS (one server) and PSLoadBalancing (each variable to the least-loaded
server)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.strategy.builders._common import Loads, Servers, assemble, pick_servers
from distlab.strategy.builders._registry import register
from distlab.strategy.types import Strategy, Sync, VariablePlan

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec


@register("PS")
def build_ps(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    servers: Servers = "first",
    batch_size: int | None = None,
) -> Strategy:
    """Every variable to the first server (AutoDist ``PS``)."""
    server = pick_servers("PS", resources, servers)[0]
    plans = [VariablePlan(v.name, sync=Sync("ps", server=server)) for v in profile.variables]
    return assemble("PS", profile, resources, plans, servers=[server], batch_size=batch_size)


@register("PSLoadBalancing")
def build_ps_load_balancing(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    servers: Servers = "first",
    batch_size: int | None = None,
) -> Strategy:
    """Each variable, in profile order, to the server with the fewest bytes so far (ties: the earlier one)."""
    chosen = pick_servers("PSLoadBalancing", resources, servers)
    loads = Loads(chosen)
    plans = [
        VariablePlan(v.name, sync=Sync("ps", server=loads.add(loads.least(), v.nbytes)))
        for v in profile.variables
    ]
    return assemble("PSLoadBalancing", profile, resources, plans, servers=chosen, batch_size=batch_size)
