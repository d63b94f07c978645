"""The communication nodes a what-if builds and re-costs: what one costs by the cost model, a call
inside a training step (``Pricing``), the measured/priced factor per kind of node, the all-reduce
buckets laid out by the runtime's own ``bucket_layout``, and gossip's in-neighbours at a new world."""

from __future__ import annotations

from typing import Any

import numpy as np

from distlab.costmodel.collectives import collective_time
from distlab.costmodel.contention import time_slicing
from distlab.strategy.execution import DDP_FIRST_BUCKET_BYTES, bucket_layout
from distlab.strategy.types import Strategy
from distlab.whatif.graph import COLLECTIVE, Node, StepGraph


class Pricing:
    """What the cost model says one communication node costs inside a training step: the
    collective's alpha-beta (within a host, scaled as calibration's training loops measured it:
    ``CostParams.alpha_scale``, ``comm_scale``; between hosts at the link's own rate) plus the
    runtime's work around each call (``call_overhead``, ``peer_call_overhead`` per peer while ranks
    take turns on the cores, ``ps_unit_overhead`` per PS variable, gossip's per-byte work)."""

    def __init__(self, cost_model: Any, resources: Any = None) -> None:
        self.table = cost_model.link_table(resources)
        self.links = cost_model.links(resources)
        self.params = cost_model.params

    def time(
        self,
        kind: str,
        nbytes: float,
        p: int,
        link: str,
        degree: float = 1.0,
        bandwidth: float | None = None,
        latency: float | None = None,
        sliced: float = 1.0,
        calls: int = 1,
    ) -> float:
        """Seconds of ``calls`` calls of ``kind`` that move ``nbytes`` between them (a PS pull is
        one broadcast per variable: runtime/ps.py)."""
        if calls > 1:
            one = self.time(kind, nbytes / calls, p, link, degree, bandwidth, latency, sliced)
            return calls * one
        prm = self.params
        c = COLLECTIVE[kind]
        alpha, beta = self.table[link][c]
        if link == "intra":
            turns = prm.comm_oversubscription * (sliced - 1.0)
            alpha, beta = alpha * (prm.alpha_scale + turns), beta * (prm.comm_scale + turns)
        if bandwidth is not None:  # every collective's beta in proportion to the link's own rate
            beta *= self.links[link].bandwidth / bandwidth
        if latency is not None:
            alpha *= latency / max(self.links[link].latency, 1e-12)
        t = float(collective_time(c, p, nbytes, alpha, beta))
        if p > 1:
            t += prm.call_overhead + prm.peer_call_overhead * (p - 1) * sliced
            t += prm.ps_unit_overhead if kind == "ps_push" else 0.0
            t += prm.gossip_per_byte * nbytes if kind == "gossip" else 0.0
        return t * degree if kind == "gossip" else t

    def call_work(self, kind: str, p: int, sliced: float = 1.0) -> float:
        """The runtime's own work around one call of ``kind`` (inside ``time``): CPU work of the
        calling rank, which a gradient call launched in backward adds to backward (swap.py)."""
        if p < 2:
            return 0.0
        prm = self.params
        work = prm.call_overhead + prm.peer_call_overhead * (p - 1) * sliced
        return work + (prm.ps_unit_overhead if kind == "ps_push" else 0.0)


def sliced(g: StepGraph) -> float:
    """How many ranks take turns on each core of the busiest host (``contention.time_slicing``)."""
    per_host = max(g.hosts.count(h) for h in set(g.hosts))
    return time_slicing(per_host, next((c for c in g.cores.values() if c), None))


def degree(node: Node) -> float:
    """Gossip messages a rank receives per step (its in-neighbours, averaged over the cycle)."""
    if not node.peers:
        return 1.0
    return float(np.mean([max(len(x) for x in step) for step in node.peers]))


def factors(g: StepGraph, pricing: Pricing) -> dict[str, float]:
    """Measured / priced per kind of communication node, at the trace's own world and link."""
    link = g.link
    seen: dict[str, list[float]] = {}
    for n in g.nodes():
        if n.kind in COLLECTIVE:
            priced = pricing.time(n.kind, n.nbytes, g.world, link, degree(n), sliced=sliced(g), calls=n.calls)
            m = seen.setdefault(n.kind, [0.0, 0.0])
            m[0] += float(n.dur.mean())
            m[1] += priced
    return {k: (m[0] / m[1] if m[1] > 0 else 1.0) for k, m in seen.items()}


def factor(g: StepGraph, kind: str) -> float:
    """Measured / priced for a node of ``kind``: the kind's own when the trace has it, else 1 (the
    cost model alone). Another kind's residual is not carried over: one all-reduce bucket's, under
    the load of a shared machine, measured 1.4x to 3.6x its price, and carried over to a PS swap's
    14 calls it put the swap at up to 2.8x the measured PS step (docs/whatif.md)."""
    return g.factors.get(kind, 1.0)


def effective_bytes(g: StepGraph, pricing: Pricing) -> None:
    """Sparse exchanges carry no byte count: the bytes that make the cost model price them as measured."""
    link = g.link
    for n in g.compute:
        if n.kind in ("allgather", "ps_sparse") and not n.nbytes:
            zero = pricing.time(n.kind, 0.0, g.world, link, sliced=sliced(g))
            per_byte = pricing.time(n.kind, 1e6, g.world, link, sliced=sliced(g)) - zero
            n.nbytes = max(0.0, (float(n.dur.mean()) - zero) / max(per_byte, 1e-15) * 1e6)


def bucket_nodes(
    g: StepGraph, entries: list[tuple[str, int, float, Any]], cap: int, pricing: Pricing, link: str, ddp: bool
) -> list[Node]:
    """All-reduce buckets of ``entries`` (variable, bytes on the wire, ready fraction, key), laid
    out by the runtime's own ``bucket_layout``, priced by the kind's factor."""
    if not entries:
        return []
    layout = bucket_layout(
        [(key, n) for _, n, _, key in entries], cap, DDP_FIRST_BUCKET_BYTES if ddp else None
    )
    rows = len(g.tail)
    out = []
    for i, members in enumerate(layout):
        nbytes = float(sum(entries[m][1] for m in members))
        t = factor(g, "allreduce") * pricing.time("allreduce", nbytes, g.world, link, sliced=sliced(g))
        out.append(
            Node(
                f"all-reduce bucket {i} (replayed)",
                "allreduce",
                "comm",
                np.full((rows, g.world), t),
                np.zeros((rows, g.world)),
                ready=max(entries[m][2] for m in members),
                nbytes=nbytes,
                variables=tuple(entries[m][0] for m in members)[:8],
                repriced=True,
            )
        )
    return out


def gossip_peers(strategy: Strategy, p: int, hosts: list[str]) -> list[list[list[int]]]:
    """Each rank's in-neighbours per step of the topology's cycle, over ``p`` ranks."""
    from distlab import topology

    cfg = strategy.gossip
    if cfg is None:
        return [[[] for _ in range(p)]]
    if cfg.topology in topology.BY_HOST:
        topo = topology.get(cfg.topology, p, hosts=hosts)
    else:
        topo = topology.get(
            cfg.topology, p, dynamic=bool(cfg.dynamic) and cfg.topology not in topology.DYNAMIC
        )
    graphs = [topo.at(t) for t in range(topo.period)] if hasattr(topo, "at") else [topo]
    out = []
    for t in graphs:
        w = np.asarray(t.weights)
        out.append([[int(i) for i in np.nonzero(w[:, j])[0] if i != j] for j in range(p)])
    return out
