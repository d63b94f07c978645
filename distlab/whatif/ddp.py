"""DDP's reducer in a step graph: it waits for its buckets inside backward, so a traced DDP
backward is cut at its last gradient's ready instant and the rest becomes the wait it was."""

from __future__ import annotations

from typing import Any

import numpy as np

from distlab.whatif.graph import Node


def split_ddp_backward(
    nodes: list[Node],
    compute: dict[tuple[int, int], list[dict[str, Any]]],
    lane_end: np.ndarray,
    full: list[int],
    p: int,
) -> tuple[list[Node], np.ndarray, str]:
    """DDP waits for its buckets inside backward: cut backward at its last gradient and make the
    rest an explicit wait (its tail: what is left after the comm lane's end as the replay
    schedules it, ``lane_end`` per step)."""
    b_index = max(i for i, n in enumerate(nodes) if n.kind == "backward")
    compute_part = np.zeros((len(full), p))
    tail = np.zeros((len(full), p))
    for r in range(p):
        for j, s in enumerate(full):
            b = compute[(r, s)][b_index]
            ready = b.get("args", {}).get("ready") or []
            cut = max((float(t) for _, _, t in ready), default=b["end"] - b["start"])
            compute_part[j, r] = cut
            done = max(b["start"] + cut, lane_end[j])
            tail[j, r] = b["end"] - done  # below 0: this rank saw the lane end sooner (graph.py)
    b = nodes[b_index]
    b.dur = np.minimum(b.dur, compute_part)
    zero = np.zeros((len(full), p))
    wait = Node(
        "waiting for gradient communication (inside DDP's backward)", "wait", "compute", zero, zero.copy()
    )
    nodes = nodes[: b_index + 1] + [wait] + nodes[b_index + 1 :]
    return nodes, tail, "DDP's backward waits for its buckets: cut at the last gradient's ready instant"
