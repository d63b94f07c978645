"""Replay a step graph: list scheduling of every rank's compute lane and its comm lane, vectorised
over ranks (numpy arrays indexed by rank), so 1,024 ranks replay as fast as 8.

A node starts when its lane is free and its dependencies are done (graph.py's edges): a compute
node after the one before it plus its gap; a collective when every rank has reached it; gossip
when the rank and its in-neighbours have (asynchronous gossip: when the rank has); a comm node
when its gradients are ready and the link is free; the wait when the comm lane is done; a stale
PS read when every rank's push of ``staleness`` steps before is done, then its own time (an
asynchronous read: its own time). The step time is the median period of the replayed steps (the
last rank's end of a step minus its end of the step before), as the run's step is the median of
its own; ``rank_step_times`` is each rank's own (an asynchronous rank's pace, which the slowest's
does not set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab.whatif.graph import JOIN_ALL, Node, StepGraph, last_backward

# the breakdown's part of each compute-lane kind (the rest is communication)
PART = {"forward": "compute", "backward": "compute", "optimizer": "optimizer"}


@dataclass
class Replayed:
    """Each node's start and end per rank (arrays) for each replayed step."""

    graph: StepGraph
    compute: list[list[tuple[np.ndarray, np.ndarray]]]  # [step][node] -> (start, end)
    comm: list[list[tuple[np.ndarray, np.ndarray]]]
    ends: np.ndarray  # per step: the last rank's end
    warm: int = 0  # replayed steps before the ones measured (a stale PS's ranks drifting to their gate)

    @property
    def step_time(self) -> float:
        """The replayed steady state's period; ranks at their own pace (a stale or asynchronous
        PS, asynchronous gossip): the slowest rank's own median period (``StepGraph.measured_step``
        takes the run's so)."""
        if self.graph.own_pace or any(n.kind == "ps_read" or n.alone for n in self.graph.compute):
            return float(np.max(self.rank_step_times))
        ends = self.ends[self.warm :]
        return float(np.median(np.diff(ends))) if len(ends) > 1 else float(ends[0])

    @property
    def rank_step_times(self) -> np.ndarray:
        """Each rank's own median period over the replayed steps: its end of a step minus its end
        of the step before (a median, as the run's own pace is taken: a shared machine's steps
        are skewed to the right)."""
        ends = np.array([times[-1][1] for times in self.compute])[self.warm :]  # [step, rank]
        return np.median(np.diff(ends, axis=0), axis=0) if len(ends) > 1 else ends[0]

    def breakdown(self) -> dict[str, float]:
        """The step of the rank that ends it, averaged over the replayed steps after the first:
        compute (forward, backward), comm (waits for the gradients and the loop's exchanges),
        optimizer, and other (Python between the calls)."""
        parts = dict.fromkeys(("compute", "comm", "optimizer"), 0.0)
        steps = self.compute[1 + self.warm :] or self.compute
        for times in steps:
            r = int(np.argmax(times[-1][1]))
            for node, (start, end) in zip(self.graph.compute, times):
                part = PART.get(node.kind, "comm")
                parts[part] += float(end[r] - start[r]) / len(steps)
        parts["other"] = max(0.0, self.step_time - sum(parts.values()))
        return parts

    def spans(self, ranks: int = 8, t0: float = 0.0) -> list[dict[str, Any]]:
        """The replayed timeline of the first ``ranks`` ranks as the timeline's spans (seconds from t0)."""
        out = []
        for s in range(len(self.compute)):
            for lane, nodes, times in (
                ("compute", self.graph.compute, self.compute[s]),
                ("comm", self.graph.comm, self.comm[s]),
            ):
                for node, (start, end) in zip(nodes, times):
                    for r in range(min(ranks, self.graph.world)):
                        out.append(
                            {
                                "name": node.name,
                                "cat": _cat(node),
                                "track": lane,
                                "start": t0 + float(start[r]),
                                "end": t0 + float(end[r]),
                                "rank": r,
                                "step": s,
                                "args": {"bytes": node.nbytes} if node.nbytes else {},
                            }
                        )
        return out


def _cat(node: Node) -> str:
    return {"ps_push": "ps", "ps_pull": "ps", "ps_sparse": "ps"}.get(node.kind, node.kind)


def replay(g: StepGraph, steps: int | None = None) -> Replayed:
    """Replay ``g`` (see the module's docstring): each recorded step once with its own durations,
    after a first step that starts every rank at once (``steps``: that many, cycling); the step
    time is the median of the replayed periods, as the run's step is the median of its own."""
    p = g.world
    t = np.zeros(p)
    backward = last_backward(g.compute)
    peers = {id(n): _peer_matrix(n, p) for n in g.compute if n.kind == "gossip"}
    rows = len(g.tail)
    compute_times, comm_times, ends = [], [], []
    pushed: list[np.ndarray] = []  # each replayed step's stale PS push ends, per rank
    # a stale PS's fast ranks run ahead until the gate holds them: replay that drift first
    gates = [n.staleness for n in g.compute if n.kind == "ps_read" and n.staleness is not None]
    warm = 4 * (max(gates) + 1) if gates and steps is None else 0
    for s in range((rows + 1 + warm) if steps is None else steps):
        j = (s - 1 - warm) % rows  # the first measured step runs the first recorded one
        times: list[tuple[np.ndarray, np.ndarray]] = []
        lane: list[tuple[np.ndarray, np.ndarray]] = []
        done = None
        for node in g.compute:
            start, dur = t + node.gap[j], node.dur[j]
            if node.kind == "wait":
                # the lane's end plus this rank's own tail (below 0: it saw the lane end sooner)
                end = np.maximum(start, np.maximum(start, start if done is None else done) + g.tail[j])
            elif node.kind in JOIN_ALL:
                end = start.max() + dur
            elif node.kind == "gossip" and not node.alone:
                m = peers[id(node)]
                end = start[m[j % len(m)]].max(axis=1) + dur
            elif node.kind == "ps_read":
                # StalePS.ready: every rank pushed the step ``staleness`` before this one
                k = node.staleness
                gate = pushed[s - k].max() if k is not None and 0 <= s - k < len(pushed) else -np.inf
                own = node.tail[j] if node.tail is not None else dur
                end = np.maximum(start, gate) + own
            else:
                end = start + dur
            if node.kind == "ps_stale":
                pushed.append(end)
            times.append((start, end))
            if node is backward:
                lane, done = _comm_lane(g, start, dur, j)
            t = end
        compute_times.append(times)
        comm_times.append(lane)
        ends.append(float(t.max()))
    return Replayed(g, compute_times, comm_times, np.array(ends), warm)


def _comm_lane(
    g: StepGraph, b_start: np.ndarray, b_dur: np.ndarray, j: int
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray | None]:
    """The step's gradient collectives, one at a time on the link, each joining every rank."""
    if not g.comm:
        return [], None
    free = -np.inf
    out = []
    for node in g.comm:
        frac = node.ready_at[j] if node.ready_at is not None else node.ready
        ready = b_start + frac * b_dur
        start = max(float(ready.max()), free)
        free = start + float(node.dur[j].max())
        out.append((ready, np.full(g.world, free)))
    return out, np.full(g.world, free)


def _peer_matrix(node: Node, p: int) -> list[np.ndarray]:
    """Per step of the cycle, a (p, 1 + max in-degree) index matrix: each rank and its in-neighbours
    (padded with itself), so one fancy index takes the latest arrival of each rank's group."""
    out = []
    for peers in node.peers or [[[] for _ in range(p)]]:
        width = 1 + max((len(x) for x in peers), default=0)
        m = np.repeat(np.arange(p)[:, None], width, axis=1)
        for r, x in enumerate(peers):
            m[r, 1 : 1 + len(x)] = x
        out.append(m)
    return out
