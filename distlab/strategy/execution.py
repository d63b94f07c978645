"""What the runtime executes for a strategy, described once: the runtime follows it and the cost
model prices it (no second copy of a rule in either).

- ``rank_threads``: torch intra-op threads per rank, the host's cores shared by its ranks;
- ``ddp_applies``: whether torch's DDP reducer can run the strategy (every variable one
  unpartitioned all-reduce with one compressor, no sparse gradients, no error feedback);
- ``bucket_layout``: all-reduce buckets, in gradient-ready order, split at a byte cap per group;
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from distlab.errors import DistlabError
from distlab.strategy.types import Strategy

BUCKET_BYTES = 4 * 2**20  # the all-reduce bucket cap of distlab's kernel
DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def rank_threads(ranks_on_host: int, cores: int | None) -> int:
    """torch intra-op threads for one rank when ``ranks_on_host`` ranks share ``cores`` cores (>= 1)."""
    n = max(int(ranks_on_host), 1)
    return max(1, int(cores) // n) if cores else 1


def ddp_applies(strategy: Strategy, sparse: Iterable[str] = (), error_feedback: bool = False) -> bool:
    """torch's DDP reducer runs ``strategy`` exactly when every variable is one unpartitioned
    all-reduce with one compressor, none has sparse gradients (names in ``sparse``), there is no
    error feedback and no gossip, on two ranks or more."""
    if error_feedback or strategy.gossip is not None or strategy.world <= 1 or not strategy.variables:
        return False
    sparse = set(sparse)
    comps = set()
    for plan in strategy.variables:
        if (
            plan.partition is not None
            or plan.sync is None
            or plan.sync.kind != "allreduce"
            or plan.name in sparse
        ):
            return False
        comps.add(plan.sync.compressor)
    return len(comps) == 1


def bucket_layout(
    entries: Sequence[tuple[Hashable, int]], cap: int = BUCKET_BYTES, first_cap: int | None = None
) -> list[list[int]]:
    """Buckets of ``entries`` (group key, bytes), given in gradient-ready order: one open bucket per
    key, closed when the next entry would pass ``cap`` (``first_cap`` for the first bucket opened,
    as DDP does); returns the entries' indices per bucket, in the order buckets open."""
    buckets: list[list[int]] = []
    open_: dict[Hashable, tuple[int, int]] = {}  # key -> (bucket index, bytes in it)
    for i, (key, nbytes) in enumerate(entries):
        hit = open_.get(key)
        limit = first_cap if first_cap is not None and hit is not None and hit[0] == 0 else cap
        if hit is None or (buckets[hit[0]] and hit[1] + nbytes > limit):
            buckets.append([])
            hit = (len(buckets) - 1, 0)
        buckets[hit[0]].append(i)
        open_[key] = (hit[0], hit[1] + int(nbytes))
    return buckets


def for_strategy(strategy: Strategy) -> Any:
    """The topology (a ``Topology`` or ``TopologySchedule``) a strategy's gossip settings name, over
    its ranks (hosts from ``strategy.ranks``)."""
    from distlab import topology  # numpy and networkx only when gossip is planned

    g = strategy.gossip
    if g is None:
        raise DistlabError(f"strategy {strategy.name}: has no gossip settings")
    n = len(strategy.ranks)
    if g.topology in topology.BY_HOST:  # two-level: the hosts come from the ranks
        return topology.get(g.topology, n, hosts=[r.host for r in strategy.ranks])
    return topology.get(g.topology, n, dynamic=bool(g.dynamic) and g.topology not in topology.DYNAMIC)
