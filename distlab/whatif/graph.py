"""A step graph from a trace: each rank's program of one training step, with durations measured
(every step after the first, each with its own durations), as dPRO and Lumos build from theirs.

Two lanes per rank, and the edges between them:

- ``compute``: the training loop's thread in program order: forward, backward, the wait for
  gradient communication, sparse exchanges, the optimizer, the PS servers' broadcast of new
  values, gossip. Each node keeps the Python before it (``gap``), as dPRO's ``GAP``.
- ``comm``: the gradient collectives backward launches (each bucket's all-reduce, each PS push),
  one at a time on the link, each ready at a fraction of backward (its last gradient's ready
  instant: a fraction survives a faster device).

Edges: program order on each lane; a comm node waits for its gradients (``ready``); a collective
joins every rank (starts when the last is ready), gossip joins a rank with its in-neighbours; the
wait node ends when the step's comm lane is done (plus the ``tail`` measured after it), so the
optimizer waits for its gradients. ``StepGraph.edges()`` lists them.

Consistency as the trace's strategy says: ``consistency.py``; DDP's wait inside backward: ``ddp.py``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab.strategy.types import Strategy
from distlab.whatif.consistency import gossip_alone, own_pace, peers_of, read_tail, staleness_of
from distlab.whatif.steps import periods, rank_periods
from distlab.whatif.trace import TraceData, TraceError, check

# the cost model's collective that prices each kind of communication node
COLLECTIVE = {
    "allreduce": "allreduce",
    "ps_push": "reduce",
    "ps_pull": "broadcast",
    "allgather": "allgather",
    "ps_sparse": "reduce",
    "gossip": "sendrecv",
}
COMPUTE_KINDS = ("forward", "backward", "optimizer")
JOIN_ALL = ("allgather", "ps_sparse", "ps_pull")  # compute-lane collectives over every rank


# runtime/stale_ps.py's spans on the loop: its push (one per step) and its read (the gated wait)
STALE_PUSH = ("PS push (stale)", "PS push (async)")
STALE_READ = "PS read"


def kind_of(span: dict[str, Any]) -> str:
    cat, name = span["cat"], span["name"]
    if span["track"] == "comm":
        return "ps_push" if cat == "ps" else "allreduce"
    if cat == "ps":
        if name.startswith(STALE_PUSH):
            return "ps_stale"
        return "ps_sparse" if "sparse" in name else "ps_pull"
    if cat == "wait" and name.startswith(STALE_READ):
        return "ps_read"
    return {"wait": "wait"}.get(cat, cat)


@dataclass
class Node:
    """One step of one lane, for every rank (arrays indexed by rank)."""

    name: str
    kind: str
    lane: str  # "compute" or "comm"
    dur: np.ndarray  # seconds, [step, rank] (a comm node's own time once every rank launched it)
    gap: np.ndarray  # seconds of Python before it on its lane, [step, rank]
    ready: float = 1.0  # comm lane: launched at this fraction of the step's last backward
    ready_at: np.ndarray | None = None  # comm lane, as traced: that fraction per [step, rank]
    nbytes: float = 0.0
    peers: list[list[list[int]]] | None = None  # gossip: per step of the cycle, each rank's in-neighbours
    variables: tuple[str, ...] = ()
    repriced: bool = False  # a what-if's node, priced at its world and link (not measured)
    alone: bool = False  # gossip: asynchronous, each rank at its own pace (no join)
    staleness: int | None = None  # ps_read: the gate s (None: asynchronous, no gate)
    tail: np.ndarray | None = None  # ps_read: its own time after the gate, [step, rank]
    calls: int = 1  # collective calls the node makes (a PS pull: one broadcast per variable)


@dataclass
class StepGraph:
    """Every rank's step (see the module's docstring), and what the replay needs besides."""

    compute: list[Node]
    comm: list[Node]
    world: int
    hosts: list[str]
    cores: dict[str, int | None]
    samples_per_step: float
    tail: np.ndarray  # [step, rank]: the wait's time after the comm lane is done (< 0: it saw it end sooner)
    ready: list[tuple[str, int, float]]  # (variable, bytes, fraction of backward), in ready order
    measured_steps: np.ndarray  # the run's step periods (s), the steps after the first
    measured_rank_steps: np.ndarray | None = None  # each rank's own median period (s)
    own_pace: bool = False  # every rank at its own pace (asynchronous gossip, a stale or async PS)
    strategy: Strategy | None = None
    optimizer: str | None = None
    source: str = "trace"
    notes: list[str] = field(default_factory=list)
    factors: dict[str, float] = field(default_factory=dict)  # measured / cost model, per comm kind

    @property
    def measured_step(self) -> float:
        """The run's median step; ranks at their own pace: the slowest rank's own median period
        (their ends of one step are different moments)."""
        if self.own_pace and self.measured_rank_steps is not None:
            return float(np.max(self.measured_rank_steps))
        return float(np.median(self.measured_steps))

    @property
    def num_hosts(self) -> int:
        return len(set(self.hosts))

    @property
    def link(self) -> str:
        """The link class its collectives cross: ``inter`` across hosts, else ``intra``."""
        return "inter" if self.num_hosts > 1 else "intra"

    def replace(self, **changes: Any) -> StepGraph:
        return dataclasses.replace(self, **changes)

    def nodes(self) -> list[Node]:
        return self.compute + self.comm

    def edges(self) -> list[tuple[str, str, str]]:
        """(from, to, why) for one step, rank-generic (see the module's docstring)."""
        out = []
        for lane in (self.compute, self.comm):
            out += [(a.name, b.name, "program order") for a, b in zip(lane, lane[1:])]
        backward = last_backward(self.compute)
        wait = next((n for n in self.compute if n.kind == "wait"), None)
        for n in self.comm:
            if backward is not None:
                out.append((backward.name, n.name, f"gradients ready at {n.ready:.0%} of backward"))
            out.append((n.name, n.name, "joins every rank"))
            if wait is not None:
                out.append((n.name, wait.name, "the optimizer waits for its gradients"))
        push = next((n for n in self.compute if n.kind == "ps_stale"), None)
        for n in self.compute:
            if n.kind in JOIN_ALL:
                out.append((n.name, n.name, "joins every rank"))
            elif n.kind == "gossip" and not n.alone:
                out.append((n.name, n.name, "joins each rank's in-neighbours"))
            elif n.kind == "ps_read" and push is not None and n.staleness is not None:
                out.append((push.name, n.name, f"every rank's push of {n.staleness} step(s) before"))
        return out


def last_backward(nodes: list[Node]) -> Node | None:
    return next((n for n in reversed(nodes) if n.kind == "backward"), None)


def _sequences(data: TraceData, track: str) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Each (rank, step)'s spans on ``track`` in order; a straggler's wait (``lab.launch(slowdown=)``)
    joins the forward before it, as the slower compute it stands for, so every rank runs one program."""
    out: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in data.spans:
        if e["track"] == track:
            out.setdefault((int(e["rank"]), int(e["step"])), []).append(e)
    for key, seq in out.items():
        seq.sort(key=lambda e: (e["start"], e["end"]))
        merged: list[dict[str, Any]] = []
        for e in seq:
            if e["cat"] == "slowdown" and merged and merged[-1]["cat"] == "forward":
                merged[-1] = {**merged[-1], "end": max(merged[-1]["end"], e["end"])}
            else:
                merged.append(e)
        out[key] = merged
    return out


def build(data: TraceData) -> StepGraph:
    """The step graph of a trace (see the module's docstring); ``TraceError`` when it has too few steps."""
    check(data)
    steps = data.steps
    if len(steps) < 2:
        raise TraceError(
            f"{data.source}: {len(steps)} traced step(s); a replay needs at least 2 (the first one warms "
            "up): launch with steps >= 3 and trace=True"
        )
    compute = _sequences(data, "compute")
    comm = _sequences(data, "comm")
    template = Counter(tuple(e["name"] for e in v) for k, v in compute.items() if k[1] != steps[0])
    names = template.most_common(1)[0][0]
    # the (rank, step)s that ran the common program, and whose step before was traced
    keys = [k for k, v in compute.items() if k[1] != steps[0] and tuple(e["name"] for e in v) == names]
    ranks = range(data.world)
    if missing := [r for r in ranks if not any(k[0] == r for k in keys)]:
        raise TraceError(
            f"{data.source}: rank {missing[0]} ran no complete step after the first; trace more steps"
        )
    comm_names = Counter(tuple(e["name"] for e in comm.get(k, [])) for k in keys).most_common(1)[0][0]
    keys = [k for k in keys if tuple(e["name"] for e in comm.get(k, [])) == comm_names]
    by_step: dict[int, list[int]] = {}
    for r, s in keys:
        by_step.setdefault(s, []).append(r)
    full = sorted(s for s, rs in by_step.items() if len(rs) == data.world)
    if not full:
        raise TraceError(f"{data.source}: no step after the first was traced on every rank; trace more steps")
    step_periods = periods(compute, data.world, steps)
    kinds = {kind_of(e) for e in compute[(0, full[0])]}
    own = own_pace(data.strategy, kinds, bool(comm_names), JOIN_ALL)
    keys = [k for k in keys if k[1] in full]
    nodes = _compute_nodes(data, compute, names, keys, full)
    comm_nodes, tail, lane_end = _comm_nodes(data, compute, comm, names, comm_names, full)
    ready = _ready(compute, names, keys)
    for n in nodes:  # runtime/ps.py broadcasts each dense PS variable on its own
        if n.kind == "ps_pull":
            n.calls = max(1, sum(c.kind == "ps_push" for c in comm_nodes))
    notes = []
    if comm_nodes and not any(n.kind == "wait" for n in nodes):
        from distlab.whatif.ddp import split_ddp_backward  # it builds this module's Node

        before = float(last_backward(nodes).dur.mean())  # type: ignore[union-attr]
        nodes, tail, note = split_ddp_backward(nodes, compute, lane_end, full, data.world)
        scale = before / max(float(last_backward(nodes).dur.mean()), 1e-9)  # type: ignore[union-attr]
        for n in comm_nodes:  # ready instants as fractions of the backward that computes
            n.ready = min(n.ready * scale, 1.0)
        ready = [(v, b, min(f * scale, 1.0)) for v, b, f in ready]
        notes.append(note)
    backward = last_backward(nodes)
    for n in comm_nodes:  # each step's own launch instant, as a fraction of its own backward
        if n.ready_at is not None and backward is not None:
            n.ready_at = np.maximum(n.ready_at / np.maximum(backward.dur, 1e-9), 0.0)
    return StepGraph(
        compute=nodes,
        comm=comm_nodes,
        world=data.world,
        hosts=list(data.hosts),
        cores=dict(data.cores),
        samples_per_step=data.samples_per_step,
        tail=tail,
        ready=ready,
        measured_steps=np.array(list(step_periods.values())),
        own_pace=own,
        measured_rank_steps=rank_periods(compute, data.world, steps),
        strategy=data.strategy,
        optimizer=data.optimizer,
        source=data.source,
        notes=notes,
    )


def _compute_nodes(
    data: TraceData,
    compute: dict[tuple[int, int], list[dict[str, Any]]],
    names: tuple[str, ...],
    keys: list[tuple[int, int]],
    full: list[int],
) -> list[Node]:
    p = data.world
    at = [full] * p  # each rank's step of each row
    nodes = []
    for i, name in enumerate(names):
        dur, gap = np.zeros((len(full), p)), np.zeros((len(full), p))
        for j in range(len(full)):
            for r in range(p):
                s = at[r][j]
                seq = compute[(r, s)]
                dur[j, r] = seq[i]["end"] - seq[i]["start"]
                before = seq[i - 1]["end"] if i else _last_end(compute.get((r, s - 1)))
                gap[j, r] = max(0.0, seq[i]["start"] - before) if before is not None else 0.0
        first = compute[(0, full[0])][i]
        kind = kind_of(first)
        args = first.get("args", {})
        node = Node(name, kind, "compute", dur, gap, nbytes=float(args.get("bytes") or 0.0))
        node.variables = tuple(args.get("variables") or ())
        if kind == "gossip" and gossip_alone(data.strategy):
            node.alone = True  # its own measured time: it waited for no one
            node.peers = peers_of(compute, i, at)
        elif kind in JOIN_ALL or kind == "gossip":
            _collective_duration(node, compute, i, full, p)
        nodes.append(node)
    push = next((j for j, n in enumerate(nodes) if n.kind == "ps_stale"), None)
    for i, node in enumerate(nodes):
        if node.kind == "ps_read":
            node.staleness = staleness_of(data.strategy)
            node.tail = read_tail(compute, i, push, node.staleness, at)
    return nodes


def _last_end(seq: list[dict[str, Any]] | None) -> float | None:
    return seq[-1]["end"] if seq else None


def _collective_duration(
    node: Node, compute: dict[tuple[int, int], list[dict[str, Any]]], i: int, full: list[int], p: int
) -> None:
    """A compute-lane collective's own time: from the last participant's arrival to its end."""
    node.dur = np.zeros((len(full), p))
    cycle = []
    for j, s in enumerate(full):
        spans = [compute[(r, s)][i] for r in range(p)]
        starts = np.array([e["start"] for e in spans])
        if node.kind == "gossip":
            peers = [
                [int(q) for q in (e.get("args", {}).get("peers") or []) if 0 <= int(q) < p] for e in spans
            ]
            cycle.append(peers)
            for r, e in enumerate(spans):
                arrive = max([starts[r], *(starts[q] for q in peers[r])])
                node.dur[j, r] = max(0.0, e["end"] - arrive)
        else:
            last = starts.max()
            for r, e in enumerate(spans):
                node.dur[j, r] = max(0.0, e["end"] - last)
    if node.kind == "gossip":
        node.peers = cycle


def _comm_nodes(
    data: TraceData,
    compute: dict[tuple[int, int], list[dict[str, Any]]],
    comm: dict[tuple[int, int], list[dict[str, Any]]],
    names: tuple[str, ...],
    comm_names: tuple[str, ...],
    full: list[int],
) -> tuple[list[Node], np.ndarray, np.ndarray]:
    """The comm lane's nodes (one at a time on the link), each rank's wait tail after it and the
    lane's end per step."""
    p = data.world
    at = [full] * p
    b_index = max(i for i, n in enumerate(names) if compute[(0, full[0])][i]["cat"] == "backward")
    w_index = next((i for i, n in enumerate(names) if compute[(0, full[0])][i]["cat"] == "wait"), None)
    durs = np.zeros((len(comm_names), len(full)))
    fracs: list[list[float]] = [[] for _ in comm_names]
    offsets = np.zeros((len(comm_names), len(full), p))  # launch, seconds after backward's start
    tail = np.zeros((len(full), p))
    lane_end = np.full(len(full), -np.inf)  # the lane's end as the replay schedules it
    for j, s in enumerate(full):
        seqs = [comm.get((r, s), []) for r in range(p)]
        prev_end = -np.inf
        for k in range(len(comm_names)):
            launch = max(seq[k]["start"] for seq in seqs)
            end = float(np.median([seq[k]["end"] for seq in seqs]))
            durs[k, j] = max(0.0, end - max(launch, prev_end))
            prev_end = max(prev_end, end)
            lane_end[j] = max(launch, lane_end[j]) + durs[k, j]
            for r in range(p):
                b = compute[(r, s)][b_index]
                fracs[k].append((seqs[r][k]["start"] - b["start"]) / max(b["end"] - b["start"], 1e-9))
                offsets[k, j, r] = seqs[r][k]["start"] - b["start"]
        if w_index is not None:
            for r in range(p):
                # after the lane's end as replayed (one end for every rank), not this rank's own,
                # and below 0 when this rank saw it end earlier (a reduce ends later on its
                # destination than on a sender): the replay's wait ends at the lane's end plus it
                w = compute[(r, at[r][j])][w_index]
                tail[j, r] = w["end"] - max(w["start"], lane_end[j])
    first = comm.get((0, full[0]), [])
    nodes = []
    for k, name in enumerate(comm_names):
        e = first[k]
        nodes.append(
            Node(
                name,
                kind_of(e),
                "comm",
                np.repeat(durs[k][:, None], p, axis=1),
                np.zeros((len(full), p)),
                ready=float(np.clip(np.mean(fracs[k]), 0.0, 1.5)),
                ready_at=offsets[k],  # seconds here; fractions once backward is final (build)
                nbytes=float(e.get("args", {}).get("bytes") or 0.0),
                variables=tuple(e.get("args", {}).get("variables") or ()),
            )
        )
    return nodes, tail, lane_end


def _ready(
    compute: dict[tuple[int, int], list[dict[str, Any]]], names: tuple[str, ...], keys: list[tuple[int, int]]
) -> list[tuple[str, int, float]]:
    """Each variable's gradient-ready instant as a fraction of backward (median over ranks and steps)."""
    seen: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    for k in keys:
        b = [e for e in compute[k] if e["cat"] == "backward"][-1]
        dur = max(b["end"] - b["start"], 1e-9)
        for var, nbytes, t in b.get("args", {}).get("ready") or ():
            seen.setdefault(var, []).append(float(t) / dur)
            sizes[var] = int(nbytes)
    out = [(v, sizes[v], float(np.median(f))) for v, f in seen.items()]
    return sorted(out, key=lambda x: x[2])
