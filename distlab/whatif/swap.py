"""A strategy swap: the trace's communication subgraph replaced by another strategy's (all-reduce
buckets, PS pushes and the servers' broadcast, gossip exchanges), on the same compute.

Each variable's gradient keeps the ready instant the trace measured; the new strategy decides where
it goes: into an all-reduce bucket (the runtime's ``bucket_layout``), a push to its PS server, or
the gossip exchange after the optimizer. The optimizer's time follows the bytes each rank steps
(a PS server steps its variables, the other ranks only their replicated ones). Sparse variables
keep the exchange the trace measured: the rows a step touches are not in the trace, so a strategy
that exchanges a sparse variable another way gets a ``TraceError`` saying what to trace instead.

A node the trace lacks is priced by the cost model (``pricing.factor``); a PS pull is one
broadcast per variable, as runtime/ps.py makes them; each gradient call's launch work goes into
backward, which launches it (``_launch_work``).

Consistency: asynchronous gossip is the same exchange with no join (graph.py). A stale or
asynchronous PS runs on the loop (its pushes, the server's optimizer step per worker's push, the
gated read: runtime/stale_ps.py), which no synchronous trace measures: a swap to one is replayed
only from a trace of a stale or asynchronous PS of the same layout (its own pushes and reads, with
the new gate), else refused naming ``cm.predict``, which prices consistency
(costmodel/consistency.py). A swap away from such a trace is refused too: its optimizer ran inside
its pushes, so no optimizer share of another strategy can be read from it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from distlab.strategy.execution import BUCKET_BYTES
from distlab.strategy.types import Strategy
from distlab.whatif.graph import COLLECTIVE, Node, StepGraph, gossip_alone, staleness_of
from distlab.whatif.pricing import Pricing, bucket_nodes, degree, factor, gossip_peers, sliced
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
    if strategy.stale or any(n.kind == "ps_stale" for n in g.compute):
        return _regate(g, strategy, notes)
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
                t = factor(g, "ps_push") * pricing.time("ps_push", share, p, link, sliced=turns)
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
    compute = _loop(g, strategy, sizes, ps_bytes, len(pushes), gossip_bytes, pricing, link)
    compute = _launch_work(g, compute, comm, pricing, p, turns)
    for kind in sorted({n.kind for n in comm + compute if n.repriced} - set(g.factors)):
        notes.append(
            f"{kind}: priced by the cost model alone (the trace has no {kind} to measure its residual)"
        )
    calls = sum(n.calls for n in comm + compute if n.repriced)
    was = sum(n.calls for n in g.comm + g.compute if n.kind in COLLECTIVE)
    if calls > was and pricing.call_work("allreduce", 2) == 0.0:
        # an uncalibrated model prices a call at its alpha alone: a PS swap of a GRU tagger's 14
        # calls replayed at 0.3-0.5x the PS run's step with it (docs/whatif.md)
        notes.append(
            f"{calls} collective calls where the trace made {was}, and the cost model has no price for "
            "a call's own work (uncalibrated): calibrate first (lab.calibrate()) for a swap that adds calls"
        )
    return g.replace(comm=sorted(comm, key=lambda n: n.ready), compute=compute, strategy=strategy)


def _launch_work(
    g: StepGraph, compute: list[Node], comm: list[Node], pricing: Pricing, p: int, turns: float
) -> list[Node]:
    """Backward with the new gradient calls' launch work in place of the trace's: each call is
    launched from backward's hook on the training thread, and its work around the wire
    (``Pricing.call_work``) shares the cores backward computes on (the analytic model counts
    it outside the overlap for the same reason: evaluate.py's ``calls``). The trace's own calls'
    work is inside its measured backward, so the difference is what changes."""
    delta = sum(pricing.call_work(n.kind, p, turns) * n.calls for n in comm) - sum(
        pricing.call_work(n.kind, g.world, sliced(g)) * n.calls for n in g.comm
    )
    if not delta:
        return compute
    from distlab.whatif.graph import last_backward

    b = last_backward(compute)
    return [replace(n, dur=np.maximum(n.dur + delta, 0.0)) if n is b else n for n in compute]


def _layout(strategy: Strategy | None) -> dict[str, tuple[int | None, ...]]:
    """Each PS variable's servers."""
    if strategy is None:
        return {}
    return {
        v.name: tuple(s.server for s in v.syncs)
        for v in strategy.variables
        if any(s.kind == "ps" for s in v.syncs)
    }


def _regate(g: StepGraph, strategy: Strategy, notes: list[str]) -> StepGraph:
    """A stale or asynchronous PS from a trace of one with the same layout: its own pushes and
    reads under the new gate; anything else refused (see the module's docstring)."""
    traced = any(n.kind == "ps_stale" for n in g.compute)
    label = _consistency_label(strategy)
    if not traced:
        raise TraceError(
            f"whatif(strategy={strategy.name}): a {label} PS pushes, steps its servers and reads on the "
            "training loop, which this trace of a synchronous strategy does not measure; price it with "
            "cm.predict(profile, resources, strategy) (costmodel/consistency.py runs each rank's clocks), "
            "or trace a run of a stale or asynchronous PS and swap from that"
        )
    if not strategy.stale:
        raise TraceError(
            f"whatif(strategy={strategy.name}): the trace is of a {_consistency_label(g.strategy)} PS, whose "
            "optimizer ran inside its pushes, so no synchronous strategy's optimizer share can be read from "
            "it; trace a run of a synchronous strategy, or price it with cm.predict(profile, resources, "
            "strategy)"
        )
    proxy = [
        any(s.kind == "ps" and s.local_replication for v in st.variables for s in v.syncs)
        for st in (g.strategy, strategy)
        if st is not None
    ]
    if _layout(strategy) != _layout(g.strategy) or len(set(proxy)) > 1:
        raise TraceError(
            f"whatif(strategy={strategy.name}): the trace's PS has another layout (servers per variable or "
            "local_replication), whose pushes and reads it does not measure; price it with "
            "cm.predict(profile, resources, strategy), or trace a run of that layout"
        )
    gate = staleness_of(strategy)
    compute = [replace(n, staleness=gate) if n.kind == "ps_read" else n for n in g.compute]
    if staleness_of(g.strategy) != gate:
        notes.append(
            f"consistency {label}: the trace's own pushes and reads, each read gated "
            + ("by no rank (asynchronous)" if gate is None else f"on every rank's push {gate} step(s) before")
        )
    return g.replace(compute=compute, strategy=strategy)


def _consistency_label(strategy: Strategy | None) -> str:
    gate = staleness_of(strategy)
    return "asynchronous" if gate is None else f"stale-synchronous (staleness {gate})"


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
    ps_calls: int,
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
                    max(1, ps_calls),
                )
            )
        if gossip_bytes:
            peers = gossip_peers(strategy, p, g.hosts)
            node = _exchange(
                g, old.get("gossip"), "gossip", "gossip exchange", gossip_bytes, peers, pricing, link
            )
            node.alone = gossip_alone(strategy)
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
    calls: int = 1,
) -> Node:
    """A loop exchange of the new strategy (``calls`` collective calls): the trace's own node
    re-priced when it had one."""
    p, rows = g.world, len(g.tail)
    node = Node(name, kind, "compute", np.zeros((rows, p)), np.zeros((rows, p)), nbytes=nbytes, peers=peers)
    node.repriced, node.calls = True, calls
    turns = sliced(g)
    now = pricing.time(kind, nbytes, p, link, degree(node), sliced=turns, calls=calls)
    if old is not None:
        was = pricing.time(kind, old.nbytes, p, link, degree(old), sliced=turns, calls=old.calls)
        node.dur = old.dur * (now / was) if was > 1e-12 else np.full((rows, p), now)
        node.gap = old.gap
    else:
        node.dur = np.full((rows, p), factor(g, kind) * now)
    return node
