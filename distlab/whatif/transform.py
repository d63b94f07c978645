"""What-ifs as transformations of a step graph (Daydream's and dPRO's primitives): re-cost the
communication at another link, world or host count; clone the rank template to a new world;
re-bucket the gradients; turn overlap off; scale compute; swap the communication subgraph for
another strategy's.

Communication nodes are re-costed by the cost model's alpha-beta (``collectives.py``), keeping
what the run measured beyond it: a node the trace has keeps its own ratio, measured / priced
(dPRO's ``ratio``), so every step keeps its noise; a node the trace lacks (a new bucket, another
strategy's PS push) is priced with its kind's factor (measured / priced, summed over the kind's
nodes), or by the cost model alone when the trace has no node of that kind (the result says so).

A world of other size keeps the hosts of the trace (ranks spread evenly over them) unless
``hosts`` says otherwise; ranks beyond the trace's play its last rank (a worker, not a server), and
when more ranks share a host's cores than in the trace, their CPU work (compute, the Python
between calls, the wait's tail) slows by the time slicing of ``costmodel.contention``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from distlab.costmodel.contention import time_slicing
from distlab.errors import ResourceError, check_positive
from distlab.strategy.types import Strategy
from distlab.whatif.graph import COLLECTIVE, COMPUTE_KINDS, Node, StepGraph
from distlab.whatif.pricing import (
    Pricing,
    bucket_nodes,
    degree,
    effective_bytes,
    factors,
    gossip_peers,
    sliced,
)
from distlab.whatif.swap import swap
from distlab.whatif.trace import TraceError


@dataclass(frozen=True)
class Change:
    """What a what-if changes (None: as traced). ``bandwidth`` bytes/s and ``latency`` s of the
    link the collectives cross; ``compute_scale`` multiplies compute time (0.5: a device twice as
    fast); ``bucket_mb`` the all-reduce bucket cap (MiB); ``overlap`` False launches every
    gradient collective after backward."""

    bandwidth: float | None = None
    latency: float | None = None
    world: int | None = None
    hosts: int | None = None
    bucket_mb: float | None = None
    overlap: bool | None = None
    compute_scale: float | None = None
    strategy: Strategy | None = None

    def check(self) -> None:
        """One line per bad value, naming the argument."""
        for name in ("bandwidth", "bucket_mb", "compute_scale"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ResourceError(f"whatif({name}={v!r}): must be a positive number")
        if self.latency is not None and not (math.isfinite(self.latency) and self.latency >= 0):
            raise ResourceError(f"whatif(latency={self.latency!r}): must be seconds >= 0")
        for name in ("world", "hosts"):
            check_positive(f"whatif: {name}", getattr(self, name), ResourceError, optional=True)
        if self.world is not None and self.hosts is not None and self.hosts > self.world:
            raise ResourceError(
                f"whatif(hosts={self.hosts}): more hosts than the {self.world} ranks of world"
            )
        if self.strategy is not None and self.world is not None and self.strategy.world != self.world:
            raise ResourceError(
                f"whatif(strategy=..., world={self.world}): the strategy is built for {self.strategy.world} "
                "ranks; build it for the world you ask about"
            )

    @property
    def comm_changed(self) -> bool:
        return any(
            v is not None for v in (self.bandwidth, self.latency, self.world, self.hosts, self.strategy)
        )


def apply(
    g: StepGraph, change: Change, cost_model: Any, resources: Any = None
) -> tuple[StepGraph, list[str]]:
    """``g`` with ``change`` applied (see the module's docstring), and notes on how it was priced."""
    change.check()
    pricing = Pricing(cost_model, resources)
    g = g.replace(
        compute=[replace(n) for n in g.compute], comm=[replace(n) for n in g.comm]
    )  # g stays as it was
    effective_bytes(g, pricing)
    g = g.replace(factors=factors(g, pricing))
    notes: list[str] = []
    p0, link0 = g.world, g.link
    p = change.world or (change.strategy.world if change.strategy is not None else p0)
    n_hosts = change.hosts or min(g.num_hosts, p)
    link = "inter" if n_hosts > 1 else "intra"
    turns0 = sliced(g)
    before = {
        n.name: pricing.time(n.kind, n.nbytes, p0, link0, degree(n), sliced=turns0, calls=n.calls)
        for n in g.nodes()
        if n.kind in COLLECTIVE
    }
    if p != p0 or n_hosts != g.num_hosts:
        g = _resize(g, p, n_hosts, notes)
    if change.strategy is not None:
        g = _swap(g, change.strategy, pricing, link, notes, change.bucket_mb)
    elif change.bucket_mb is not None:
        g = _rebucket(g, change.bucket_mb, pricing, link, notes)
    if change.comm_changed:
        turns = sliced(g)
        for n in g.nodes():
            if n.kind not in COLLECTIVE:
                continue
            now = pricing.time(
                n.kind, n.nbytes, p, link, degree(n), change.bandwidth, change.latency, turns, n.calls
            )
            # a what-if's own node was priced at the link as calibrated; a traced one keeps its ratio
            at = (
                pricing.time(n.kind, n.nbytes, p, link, degree(n), sliced=turns, calls=n.calls)
                if n.repriced
                else before.get(n.name, 0.0)
            )
            if at > 1e-12:
                n.dur = n.dur * (now / at)
        if change.strategy is None and any(n.kind in ("ps_stale", "ps_read") for n in g.compute):
            notes.append(
                "stale PS: its pushes and reads keep their measured time (the trace's span of a push "
                "holds the server's optimizer step too); only the gate follows the new world"
            )
    if change.overlap is False:
        g = g.replace(
            comm=[
                replace(
                    n,
                    ready=max(n.ready, 1.0),
                    ready_at=None if n.ready_at is None else np.maximum(n.ready_at, 1.0),
                )
                for n in g.comm
            ]
        )
    elif change.overlap is True and all(n.ready >= 1.0 for n in g.comm):
        notes.append("overlap: the traced run launched nothing during backward; nothing to overlap")
    if change.compute_scale is not None:
        k = float(change.compute_scale)
        g = g.replace(
            compute=[replace(n, dur=n.dur * k) if n.kind in COMPUTE_KINDS else n for n in g.compute]
        )
    return g, notes


def _resize(g: StepGraph, p: int, n_hosts: int, notes: list[str]) -> StepGraph:
    """The rank template cloned to ``p`` ranks on ``n_hosts`` hosts; CPU work slowed by time slicing.

    Ranks the trace has play themselves; ranks beyond it play its last rank (a worker: PS servers
    and gossip's special ranks are numbered from 0), so a server's work is not cloned."""
    tmap = np.minimum(np.arange(p), g.world - 1)
    host_names = sorted(set(g.hosts), key=g.hosts.index)
    hosts = [host_names[h] if h < len(host_names) else f"host{h}" for h in (np.arange(p) * n_hosts // p)]
    per_host_before = max(g.hosts.count(h) for h in host_names)
    per_host = max(hosts.count(h) for h in set(hosts))
    cores = next((c for c in g.cores.values() if c), None)
    slow = time_slicing(per_host, cores) / time_slicing(per_host_before, cores)
    if slow != 1.0:
        notes.append(
            f"{per_host} ranks per host on {cores} cores: "
            f"their CPU work {slow:.2f}x the trace's (time slicing)"
        )

    def clone(n: Node) -> Node:
        cpu = n.kind in COMPUTE_KINDS
        out = replace(n, dur=n.dur[:, tmap] * (slow if cpu else 1.0), gap=n.gap[:, tmap] * slow)
        if n.tail is not None:
            out.tail = n.tail[:, tmap]
        if n.ready_at is not None:
            out.ready_at = n.ready_at[:, tmap]
        if n.kind == "gossip":
            out.peers = gossip_peers(g.strategy, p, hosts) if g.strategy is not None else None
        return out

    return g.replace(
        compute=[clone(n) for n in g.compute],
        comm=[clone(n) for n in g.comm],
        world=p,
        hosts=hosts,
        cores={h: cores for h in set(hosts)},
        tail=g.tail[:, tmap] * slow,
        samples_per_step=g.samples_per_step * p / g.world,
    )


def _need_ready(g: StepGraph, what: str) -> None:
    if not g.ready:
        raise TraceError(
            f"{g.source}: {what} needs each gradient's ready instant, which this trace lacks; trace the run "
            "again with this distlab (lab.launch(..., trace=True))"
        )


def _rebucket(g: StepGraph, bucket_mb: float, pricing: Pricing, link: str, notes: list[str]) -> StepGraph:
    _need_ready(g, "bucket_mb")
    ddp = any(n.kind == "wait" and "DDP" in n.name for n in g.compute)
    names = _allreduce_variables(g)
    if not names:
        notes.append(f"bucket_mb={bucket_mb:g}: the run all-reduced no gradient; nothing to re-bucket")
        return g
    entries = [(v, b, f, 0) for v, b, f in g.ready if v in names]
    cap = int(bucket_mb * 2**20)
    new = bucket_nodes(g, entries, cap, pricing, link, ddp)
    rest = [n for n in g.comm if n.kind != "allreduce"]
    notes.append(
        f"bucket_mb={bucket_mb:g}: {len(new)} all-reduce bucket(s) where the run had "
        f"{sum(n.kind == 'allreduce' for n in g.comm)}"
    )
    return g.replace(comm=sorted(rest + new, key=lambda n: n.ready))


def _allreduce_variables(g: StepGraph) -> set[str]:
    """The variables the run all-reduced (every gradient the trace saw, unless its strategy says
    otherwise)."""
    if g.strategy is None:
        return {v for v, _, _ in g.ready}
    out = set()
    for v, _, _ in g.ready:
        plan = _plan(g.strategy, v)
        if plan is not None and any(s.kind in ("allreduce", "allgather") for s in plan.syncs):
            out.add(v)
    return out


def _plan(strategy: Strategy, label: str) -> Any:
    name = label.split("[shard ")[0]
    return next((p for p in strategy.variables if p.name == name), None)


def _swap(
    g: StepGraph, strategy: Strategy, pricing: Pricing, link: str, notes: list[str], bucket_mb: float | None
) -> StepGraph:
    """The communication subgraph of ``strategy`` in place of the trace's (see ``swap.py``), its
    all-reduce buckets capped at ``bucket_mb`` when asked (else the runtime's default)."""
    _need_ready(g, "strategy=")
    if bucket_mb is None:
        return swap(g, strategy, pricing, link, notes)
    return swap(g, strategy, pricing, link, notes, int(bucket_mb * 2**20))
