"""Shared rules of the builders: server choice, shard counts, load tracking and strategy assembly."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distlab.errors import StrategyError, check_positive
from distlab.strategy.types import (
    COMPRESSORS,
    BatchConfig,
    GossipConfig,
    Partition,
    Strategy,
    Sync,
    VariablePlan,
)

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec

Servers = str | Sequence[int]


def pick_servers(builder: str, resources: ResourceSpec, servers: Servers = "first") -> list[int]:
    """Server ranks: ``"first"`` = first rank of each host (AutoDist: one PS per node), ``"all"``, or a
    list."""
    if servers == "first":
        return [resources.ranks_on(h)[0] for h in resources.hosts]
    if servers == "all":
        return [r.rank for r in resources.ranks]
    if isinstance(servers, str) or not isinstance(servers, Sequence) or not servers:
        raise StrategyError(f"{builder}: servers must be 'first', 'all' or a list of ranks, got {servers!r}")
    out: list[int] = []
    for s in servers:
        if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < resources.world:
            raise StrategyError(f"{builder}: servers: rank {s!r} does not exist ({resources.world} ranks)")
        if s in out:
            raise StrategyError(f"{builder}: servers: rank {s} listed twice")
        out.append(s)
    return out


def consistency(builder: str, sync: Any = True, staleness: Any = 0, local_replication: Any = False) -> dict:
    """A PS-family builder's consistency options, checked, as ``Sync`` fields (AutoDist's
    ``PSSynchronizer``: sync, staleness, local_replication)."""
    for name, v in (("sync", sync), ("local_replication", local_replication)):
        if not isinstance(v, bool):
            raise StrategyError(f"{builder}: {name} must be True or False, got {v!r}")
    if not isinstance(staleness, int) or isinstance(staleness, bool) or staleness < 0:
        raise StrategyError(f"{builder}: staleness must be an integer >= 0, got {staleness!r}")
    if staleness > 0 and not sync:
        raise StrategyError(
            f"{builder}: staleness={staleness} with sync=False; staleness bounds a synchronous PS: pass "
            "sync=True, or staleness=0 for asynchronous PS"
        )
    return {"sync": sync, "staleness": staleness, "local_replication": local_replication}


def check_chunk(builder: str, chunk_size: Any) -> int:
    check_positive(f"{builder}: chunk_size", chunk_size, StrategyError)
    return chunk_size


def check_compressor(builder: str, compressor: Any) -> str:
    if compressor not in COMPRESSORS:
        raise StrategyError(f"{builder}: compressor {compressor!r} is not one of: {', '.join(COMPRESSORS)}")
    return compressor


def smallest_divisor(dim: int) -> int:
    """Smallest divisor >= 2 of dim (dim itself when prime); 1 when dim < 2 (not split)."""
    if dim < 2:
        return 1
    for i in range(2, math.isqrt(dim) + 1):
        if dim % i == 0:
            return i
    return dim


def smallest_non_divisor(dim: int) -> int:
    """Smallest i in [2, dim) that does not divide dim: uneven shards; ``dim`` when there is none
    (AutoDist's ``UnevenPartitionedPS.get_num_shards``: dimension 2 splits in two, 1 stays whole)."""
    for i in range(2, dim):
        if dim % i:
            return i
    return max(dim, 1)


def shard_counts(var: Any, rule: str = "even") -> int:
    """AutoDist's PartitionedPS shard count along axis 0 (1: not split: scalar or dimension 0 of size 1)."""
    if not var.shape:
        return 1
    return smallest_divisor(var.shape[0]) if rule == "even" else smallest_non_divisor(var.shape[0])


class Loads:
    """Bytes placed on each server so far, in server order."""

    def __init__(self, servers: list[int]) -> None:
        self.bytes = {s: 0.0 for s in servers}

    def least(self) -> int:
        """The server with the fewest bytes (ties: the earlier server)."""
        return min(self.bytes, key=lambda s: self.bytes[s])

    def by_load(self) -> list[int]:
        """Servers sorted by current load, stable (ties keep server order)."""
        return sorted(self.bytes, key=lambda s: self.bytes[s])

    def add(self, server: int, nbytes: float) -> int:
        self.bytes[server] += nbytes
        return server


def place_partitioned(var: Any, shards: int, loads: Loads, ps: dict | None = None) -> VariablePlan:
    """Split along axis 0 into ``shards``; shards go to servers by load, round-robin beyond their
    count, each charging the variable's bytes divided evenly by the shards (AutoDist's greedy
    placement, uneven shards included: the load is what the balancer counted, not the shard's size).
    ``ps``: the consistency fields of every shard's sync (``consistency``)."""
    ps = ps or {}
    if shards < 2:
        return VariablePlan(var.name, sync=Sync("ps", server=loads.add(loads.least(), var.nbytes), **ps))
    part = Partition(0, shards)
    order = loads.by_load()
    syncs = [
        Sync("ps", server=loads.add(order[k % len(order)], var.nbytes / shards), **ps) for k in range(shards)
    ]
    return VariablePlan(var.name, partition=part, shards=tuple(syncs))


def assemble(
    builder: str,
    profile: ModelProfile,
    resources: ResourceSpec,
    variables: list[VariablePlan],
    *,
    servers: Sequence[int] = (),
    batch_size: int | None = None,
    gossip: GossipConfig | None = None,
) -> Strategy:
    """The Strategy over the resources' ranks (options are recorded by the registry's wrapper)."""
    check_positive(f"{builder}: batch_size", batch_size, StrategyError, optional=True)
    return Strategy(
        variables=tuple(variables),
        ranks=tuple(resources.ranks),
        servers=tuple(servers),
        batch=BatchConfig(batch_size or profile.batch_size),
        gossip=gossip,
        builder=builder,
    )
