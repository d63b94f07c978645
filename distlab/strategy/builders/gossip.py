"""Gossip (BlueFog): parameters averaged with topology neighbours instead of a global all-reduce."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.errors import DistlabError, StrategyError
from distlab.strategy.builders._common import Loads, Servers, assemble, pick_servers
from distlab.strategy.builders._registry import register
from distlab.strategy.types import (
    ASYNC_GOSSIP_MODES,
    GOSSIP_MODES,
    GossipConfig,
    Strategy,
    Sync,
    VariablePlan,
)

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
    mode: str | None = None,
    asynchronous: bool = False,
    sparse: str = "gossip",
    servers: Servers = "first",
    batch_size: int | None = None,
) -> Strategy:
    """Every dense variable by gossip; embeddings too unless ``sparse="ps"`` (or ``"allgather"``).

    Variables with sparse gradients cannot be gossiped (dense-only kernel): with ``sparse="gossip"``
    they are all-gathered. Dynamic topologies (``one_peer_exp2``, ``hierarchical``) imply ``dynamic``.
    ``mode``: ``atc`` (default) or ``awc`` synchronous; with ``asynchronous=True`` (BlueFog's
    windows, no barrier per step) ``push_sum`` (default) or ``average``. An asynchronous plan
    gossips every dense variable and has no collective per step, so its sparse variables go to a
    PS only if ``sparse="ps"`` is asked for, and are refused otherwise.
    """
    from distlab import topology as topo  # numpy/networkx only when gossip is planned
    from distlab.strategy.execution import for_strategy

    if resources.world < 2:
        raise StrategyError("Gossip: needs at least 2 ranks (got 1); use AllReduce or PS")
    if not isinstance(asynchronous, bool):
        raise StrategyError(f"Gossip: asynchronous must be True or False, got {asynchronous!r}")
    modes = ASYNC_GOSSIP_MODES if asynchronous else GOSSIP_MODES
    mode = modes[0] if mode is None else mode
    if mode not in modes:
        kind = "an asynchronous" if asynchronous else "a synchronous"
        raise StrategyError(f"Gossip: mode {mode!r} is not {kind} mode; use one of: {', '.join(modes)}")
    if sparse not in SPARSE_CHOICES:
        raise StrategyError(f"Gossip: sparse {sparse!r} is not one of: {', '.join(SPARSE_CHOICES)}")
    if not isinstance(dynamic, bool):
        raise StrategyError(f"Gossip: dynamic must be True or False, got {dynamic!r}")
    config = GossipConfig(topology, dynamic or topology in topo.DYNAMIC, mode, asynchronous)
    probe = assemble("Gossip", profile, resources, [], gossip=config)
    try:
        for_strategy(probe)
    except DistlabError as exc:
        raise StrategyError(f"Gossip: topology: {exc}") from None
    if asynchronous:
        if sparse != "gossip":
            raise StrategyError(
                f"Gossip: sparse={sparse!r} needs a collective every step, which asynchronous gossip has "
                "not; use sparse='gossip' or asynchronous=False"
            )
        for v in profile.variables:
            if v.sparse:
                raise StrategyError(
                    f"Gossip: variable {v.name!r} has sparse gradients, which asynchronous gossip cannot "
                    "average; build it with dense gradients (nn.Embedding(sparse=False)) or use "
                    "asynchronous=False"
                )
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
