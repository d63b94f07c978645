"""Gossip (BlueFog): parameters averaged with topology neighbours instead of a global all-reduce."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.errors import DistlabError, StrategyError
from distlab.strategy.builders._common import Loads, Servers, assemble, pick_servers
from distlab.strategy.builders._registry import register
from distlab.strategy.types import GOSSIP_MODES, GossipConfig, Strategy, Sync, VariablePlan

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec

SPARSE_CHOICES = ("gossip", "ps", "allgather")


@register("Gossip")
def build_gossip(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    topology: str = "exp2",
    dynamic: bool = False,
    mode: str = "atc",
    sparse: str = "gossip",
    servers: Servers = "first",
    batch_size: int | None = None,
) -> Strategy:
    """Every dense variable by gossip; embeddings too unless ``sparse="ps"`` (or ``"allgather"``).

    Variables with sparse gradients cannot be gossiped (dense-only kernel): with ``sparse="gossip"``
    they are all-gathered. Dynamic topologies (``one_peer_exp2``, ``hierarchical``) imply ``dynamic``.
    """
    from distlab import topology as topo  # numpy/networkx only when gossip is planned
    from distlab.strategy.execution import for_strategy

    if resources.world < 2:
        raise StrategyError("Gossip: needs at least 2 ranks (got 1); use AllReduce or PS")
    if mode not in GOSSIP_MODES:
        raise StrategyError(f"Gossip: mode {mode!r} is not one of: {', '.join(GOSSIP_MODES)}")
    if sparse not in SPARSE_CHOICES:
        raise StrategyError(f"Gossip: sparse {sparse!r} is not one of: {', '.join(SPARSE_CHOICES)}")
    if not isinstance(dynamic, bool):
        raise StrategyError(f"Gossip: dynamic must be True or False, got {dynamic!r}")
    config = GossipConfig(topology, dynamic or topology in topo.DYNAMIC, mode)
    probe = assemble("Gossip", profile, resources, [], gossip=config)
    try:
        for_strategy(probe)
    except DistlabError as exc:
        raise StrategyError(f"Gossip: topology: {exc}") from None
    chosen = pick_servers("Gossip", resources, servers) if sparse == "ps" else []
    loads = Loads(chosen)
    plans = []
    for v in profile.variables:
        if v.embedding and sparse == "ps":
            sync = Sync("ps", server=loads.add(loads.least(), v.nbytes))
        elif (v.embedding and sparse == "allgather") or v.sparse:
            sync = Sync("allgather")
        else:
            sync = Sync("gossip")
        plans.append(VariablePlan(v.name, sync=sync))
    used = chosen if any(p.sync.kind == "ps" for p in plans) else []
    return assemble("Gossip", profile, resources, plans, servers=used, batch_size=batch_size, gossip=config)
