"""Parameter-server builders: PS (one server) and PSLoadBalancing (each variable to the least-loaded
server)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.strategy.builders._common import Loads, Servers, assemble, consistency, pick_servers
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
    sync: bool = True,
    staleness: int = 0,
    local_replication: bool = False,
) -> Strategy:
    """Every variable to the first server (AutoDist ``PS``); ``sync``, ``staleness`` and
    ``local_replication`` are AutoDist's PS consistency (``Sync``)."""
    ps = consistency("PS", sync, staleness, local_replication)
    server = pick_servers("PS", resources, servers)[0]
    plans = [VariablePlan(v.name, sync=Sync("ps", server=server, **ps)) for v in profile.variables]
    return assemble("PS", profile, resources, plans, servers=[server], batch_size=batch_size)


@register("PSLoadBalancing")
def build_ps_load_balancing(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    servers: Servers = "first",
    batch_size: int | None = None,
    sync: bool = True,
    staleness: int = 0,
    local_replication: bool = False,
) -> Strategy:
    """Each variable, in profile order, to the server with the fewest bytes so far (ties: the earlier one);
    the consistency options as ``PS``."""
    ps = consistency("PSLoadBalancing", sync, staleness, local_replication)
    chosen = pick_servers("PSLoadBalancing", resources, servers)
    loads = Loads(chosen)
    plans = [
        VariablePlan(v.name, sync=Sync("ps", server=loads.add(loads.least(), v.nbytes), **ps))
        for v in profile.variables
    ]
    return assemble("PSLoadBalancing", profile, resources, plans, servers=chosen, batch_size=batch_size)
