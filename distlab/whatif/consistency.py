"""The consistency a trace's strategy says its ranks ran at (runtime/stale_ps.py,
runtime/async_gossip.py), and what the step graph measures of it: a stale PS read's own time
after its gate, an asynchronous exchange's in-neighbours.

- a stale-synchronous or asynchronous PS pushes on the loop (``ps_stale``: each rank's own time,
  no join) and then reads (``ps_read``): at staleness s the read of a rank that pushed step c
  waits until every rank pushed step c-s (``StalePS.ready``: clock c+1 needs clocks 0..c-s of
  every worker), then its own answer's time (``Node.tail``, measured after that gate); an
  asynchronous read has no gate, only its own time;
- asynchronous gossip exchanges at each rank's own pace (``Node.alone``): no join with the
  in-neighbours.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from distlab.strategy.types import Strategy


def staleness_of(strategy: Strategy | None) -> int | None:
    """The PS read's gate: staleness s of a stale-synchronous PS, None when asynchronous (no gate)."""
    sync, s = strategy.consistency if strategy is not None else (True, 0)
    return s if sync else None


def gossip_alone(strategy: Strategy | None) -> bool:
    """Asynchronous gossip: each rank exchanges at its own pace, joined with no in-neighbour."""
    cfg = strategy.gossip if strategy is not None else None
    return bool(cfg is not None and cfg.asynchronous)


def own_pace(strategy: Strategy | None, kinds: set[str], comm: bool, joins: tuple[str, ...]) -> bool:
    """Every rank runs at its own pace (asynchronous gossip, a stale or asynchronous PS) and no
    node of its step (``kinds``; ``comm``: a comm lane) joins another rank: its step is then the
    slowest rank's own pace (``StepGraph.measured_step``)."""
    if not (gossip_alone(strategy) or staleness_of(strategy) != 0) or comm:
        return False
    return not (kinds & set(joins)) and ("gossip" not in kinds or gossip_alone(strategy))


def peers_of(compute: dict[tuple[int, int], list[dict[str, Any]]], i: int, at: list[list[int]]) -> list:
    """Each replayed step's in-neighbours of every rank, as the gossip spans recorded them."""
    p = len(at)
    return [
        [
            [
                int(q)
                for q in (compute[(r, at[r][j])][i].get("args", {}).get("peers") or [])
                if 0 <= int(q) < p
            ]
            for r in range(p)
        ]
        for j in range(len(at[0]))
    ]


def read_tail(
    compute: dict[tuple[int, int], list[dict[str, Any]]],
    i: int,
    push: int | None,
    staleness: int | None,
    at: list[list[int]],
) -> np.ndarray:
    """A stale PS read's own time: from the later of its start and its gate (every rank's push of
    ``staleness`` steps before ended: ``StalePS.ready``) to its end. Asynchronous: all of it."""
    p = len(at)
    tail = np.zeros((len(at[0]), p))
    for j in range(len(at[0])):
        for r in range(p):
            s, gate = at[r][j], -np.inf
            if staleness is not None and push is not None:
                before = [compute.get((q, s - staleness)) for q in range(p)]
                if all(seq is not None and len(seq) > push for seq in before):
                    gate = max(seq[push]["end"] for seq in before)  # type: ignore[index]
            e = compute[(r, s)][i]
            tail[j, r] = max(0.0, e["end"] - max(e["start"], gate))
    return tail
