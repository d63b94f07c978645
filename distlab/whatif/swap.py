"""A strategy swap: the trace's communication subgraph replaced by another strategy's (all-reduce
buckets, PS pushes and the servers' broadcast, gossip exchanges), on the same compute.

Each variable's gradient keeps the ready instant the trace measured; the new strategy decides where
it goes: into an all-reduce bucket (the runtime's ``bucket_layout``), a push to its PS server, or
the gossip exchange after the optimizer. The optimizer's time follows the bytes each rank steps
(a PS server steps its variables, the other ranks only their replicated ones). Sparse variables
keep the exchange the trace measured: the rows a step touches are not in the trace, so a strategy
that exchanges a sparse variable another way gets a ``TraceError`` saying what to trace instead.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from distlab.strategy.execution import BUCKET_BYTES
from distlab.strategy.types import Strategy
from distlab.whatif.graph import Node, StepGraph
from distlab.whatif.pricing import Pricing, bucket_nodes, degree, gossip_peers, sliced
from distlab.whatif.trace import TraceError

SPARSE_KIND = {"allgather": "allgather", "ps_sparse": "ps"}  # the sync kind each sparse exchange serves


def variables(g: StepGraph) -> dict[str, tuple[int, float]]:
    """Each variable the trace saw: (bytes, ready fraction), shards summed."""
    out: dict[str, tuple[int, float]] = {}
    for label, nbytes, frac in g.ready:
        name = label.split("[shard ")[0]
        b, f = out.get(name, (0, 0.0))
        out[name] = (b + int(nbytes), max(f, frac))
    return out


def stepped_bytes(strategy: Strategy | None, sizes: dict[str, tuple[int, float]], p: int) -> np.ndarray:
    """Bytes each rank's optimizer steps: replicated variables everywhere, PS shards on their server."""
    out = np.zeros(p)
    for name, (nbytes, _) in sizes.items():
        plan = next((v for v in strategy.variables if v.name == name), None) if strategy is not None else None
        syncs = plan.syncs if plan is not None else ()
        if not syncs or all(s.kind != "ps" for s in syncs):
            out += nbytes
            continue
        for s in syncs:
            share = nbytes / len(syncs)
            if s.kind == "ps" and s.server is not None and s.server < p:
                out[s.server] += share
            elif s.kind != "ps":
                out += share
    return out


def swap(
    g: StepGraph,
    strategy: Strategy,
    pricing: Pricing,
    link: str,
    notes: list[str],
    cap: int = BUCKET_BYTES,
) -> StepGraph:
    sizes = variables(g)
    planned = {v.name for v in strategy.variables}
    if unseen := sorted(planned - set(sizes)):
        raise TraceError(
            f"whatif(strategy={strategy.name}): variable {unseen[0]!r} is not in the trace ({len(unseen)} "
            "unseen); the strategy is for another model: build it for the traced run's model"
        )
    if unplanned := sorted(set(sizes) - planned):
        raise TraceError(
            f"whatif(strategy={strategy.name}): the traced variable {unplanned[0]!r} has no plan; build the "
            "strategy for the traced run's model"
        )
    sparse = _sparse_kinds(g)
    for name, kind in sparse.items():
        plan = strategy.plan(name)
        if {s.kind for s in plan.syncs} != {kind}:
            raise TraceError(
                f"whatif(strategy={strategy.name}): sparse variable {name!r} was exchanged by {kind} in the "
                f"trace and by {'/'.join(sorted({s.kind for s in plan.syncs}))} in the strategy; the rows a "
                "step touches are not in the trace: trace a run of that strategy instead"
            )
    p, rows, turns = g.world, len(g.tail), sliced(g)
    buckets, pushes, ps_bytes, gossip_bytes = [], [], 0.0, 0.0
    for name, (nbytes, frac) in sizes.items():
        if name in sparse:
            continue
        plan = strategy.plan(name)
        for s in plan.syncs:
            share = nbytes / len(plan.syncs)
            if s.kind in ("allreduce", "allgather"):
                wire = share / 2 if s.compressor in ("fp16", "bf16") else share
                buckets.append((name, int(wire), frac, (s.group or 0, s.compressor)))
            elif s.kind == "ps":
                t = g.factors.get("ps_push", 1.0) * pricing.time("ps_push", share, p, link, sliced=turns)
                pushes.append(
                    Node(
                        f"PS push {name} to rank {s.server} (replayed)",
                        "ps_push",
                        "comm",
                        np.full((rows, p), t),
                        np.zeros((rows, p)),
                        ready=frac,
                        nbytes=share,
                        repriced=True,
                    )
                )
                ps_bytes += share
            elif s.kind == "gossip":
                gossip_bytes += share
    buckets.sort(key=lambda e: e[2])
    comm = bucket_nodes(g, buckets, cap, pricing, link, False) + pushes
    compute = _loop(g, strategy, sizes, ps_bytes, gossip_bytes, pricing, link)
    for kind in sorted({n.kind for n in comm + compute if n.repriced} - set(g.factors)):
        notes.append(
            f"{kind}: priced by the cost model alone (the trace has no {kind} to measure its residual)"
        )
    return g.replace(comm=sorted(comm, key=lambda n: n.ready), compute=compute, strategy=strategy)


def _sparse_kinds(g: StepGraph) -> dict[str, str]:
    out = {}
    for n in g.compute:
        if n.kind in SPARSE_KIND:
            for v in n.variables:
                out[v.split("[shard ")[0]] = SPARSE_KIND[n.kind]
    return out


def _loop(
    g: StepGraph,
    strategy: Strategy,
    sizes: dict[str, tuple[int, float]],
    ps_bytes: float,
    gossip_bytes: float,
    pricing: Pricing,
    link: str,
) -> list[Node]:
    """The training loop with the new strategy's optimizer share, PS broadcast and gossip exchange."""
    p = g.world
    old = {n.kind: n for n in g.compute if n.kind in ("ps_pull", "gossip")}
    before, after = stepped_bytes(g.strategy, sizes, p), stepped_bytes(strategy, sizes, p)
    ref = int(np.argmax(before))
    out = []
    for n in g.compute:
        if n.kind in ("ps_pull", "gossip"):
            continue
        if n.kind == "optimizer":
            scale = np.where(before > 0, after / np.maximum(before, 1), after / max(before[ref], 1))
            base = np.where(before > 0, n.dur, n.dur[:, [ref]])
            n = replace(n, dur=base * scale)
        out.append(n)
        if n.kind != "optimizer":
            continue
        if ps_bytes:
            out.append(
                _exchange(
                    g,
                    old.get("ps_pull"),
                    "ps_pull",
                    "PS pull (servers broadcast new values)",
                    ps_bytes,
                    None,
                    pricing,
                    link,
                )
            )
        if gossip_bytes:
            peers = gossip_peers(strategy, p, g.hosts)
            node = _exchange(
                g, old.get("gossip"), "gossip", "gossip exchange", gossip_bytes, peers, pricing, link
            )
            out.append(node)
    return out


def _exchange(
    g: StepGraph,
    old: Node | None,
    kind: str,
    name: str,
    nbytes: float,
    peers: list[list[list[int]]] | None,
    pricing: Pricing,
    link: str,
) -> Node:
    """A loop exchange of the new strategy: the trace's own node re-priced when it had one."""
    p, rows = g.world, len(g.tail)
    node = Node(name, kind, "compute", np.zeros((rows, p)), np.zeros((rows, p)), nbytes=nbytes, peers=peers)
    node.repriced = True
    turns = sliced(g)
    now = pricing.time(kind, nbytes, p, link, degree(node), sliced=turns)
    if old is not None:
        was = pricing.time(kind, old.nbytes, p, link, degree(old), sliced=turns)
        node.dur = old.dur * (now / was) if was > 1e-12 else np.full((rows, p), now)
        node.gap = old.gap
    else:
        node.dur = np.full((rows, p), g.factors.get(kind, 1.0) * now)
    return node
