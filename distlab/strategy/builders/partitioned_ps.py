"""Partitioned parameter servers: variables split along axis 0, shards spread over servers by load."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distlab.strategy.builders._common import (
    Loads,
    Servers,
    assemble,
    consistency,
    pick_servers,
    place_partitioned,
    shard_counts,
)
from distlab.strategy.builders._registry import register
from distlab.strategy.types import Strategy

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec


def _build(
    name: str,
    rule: str,
    profile: ModelProfile,
    resources: ResourceSpec,
    servers: Servers,
    batch_size: int | None,
    ps: dict,
) -> Strategy:
    chosen = pick_servers(name, resources, servers)
    loads = Loads(chosen)
    plans = [place_partitioned(v, shard_counts(v, rule), loads, ps) for v in profile.variables]
    return assemble(name, profile, resources, plans, servers=chosen, batch_size=batch_size)


@register("PartitionedPS")
def build_partitioned_ps(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    servers: Servers = "first",
    batch_size: int | None = None,
    sync: bool = True,
    staleness: int = 0,
    local_replication: bool = False,
) -> Strategy:
    """Shards = smallest divisor >= 2 of dimension 0 (AutoDist ``PartitionedPS``); unsplit ones to the
    least-loaded server."""
    ps = consistency("PartitionedPS", sync, staleness, local_replication)
    return _build("PartitionedPS", "even", profile, resources, servers, batch_size, ps)


@register("UnevenPartitionedPS")
def build_uneven_partitioned_ps(
    profile: ModelProfile,
    resources: ResourceSpec,
    *,
    servers: Servers = "first",
    batch_size: int | None = None,
    sync: bool = True,
    staleness: int = 0,
    local_replication: bool = False,
) -> Strategy:
    """As PartitionedPS, shards = smallest i >= 2 that does not divide dimension 0 (unequal shard sizes)."""
    ps = consistency("UnevenPartitionedPS", sync, staleness, local_replication)
    return _build("UnevenPartitionedPS", "uneven", profile, resources, servers, batch_size, ps)
