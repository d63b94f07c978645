"""Gossip in-degree per topology: how many neighbour messages the busiest rank receives per step (BlueFog)."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from distlab.strategy.types import Strategy


def _in_degree(topo: Any) -> float:
    """Most in-neighbours of any rank; for a schedule, averaged over its period (one step each)."""
    if hasattr(topo, "at"):
        return float(np.mean([_in_degree(topo.at(t)) for t in range(topo.period)]))
    w = np.asarray(topo.weights)
    return float(((w != 0) & ~np.eye(w.shape[0], dtype=bool)).sum(axis=0).max())


def _formula_in_degree(name: str, p: int, dynamic: bool) -> float:
    """Closed forms for BlueFog's topologies, used when the topology module cannot build one."""
    if dynamic or "one_peer" in name:
        return 1.0
    if name == "ring":
        return 1.0 if p == 2 else 2.0
    if name in ("full", "star"):
        return float(p - 1)
    return float(math.floor(math.log2(p - 1)) + 1)  # exp2: in-neighbours at offsets 1, 2, 4, ... < p


@lru_cache(maxsize=4096)  # memo of a pure function of its arguments
def gossip_in_degree(topology: str, p: int, dynamic: bool) -> float:
    """Messages one rank receives per step under a BlueFog topology (the busiest rank; schedules averaged)."""
    if p <= 1:
        return 0.0
    try:
        from distlab import topology as topo_mod

        dyn = dynamic and topology not in getattr(topo_mod, "DYNAMIC", ())
        return _in_degree(topo_mod.get(topology, p, dynamic=dyn))
    except Exception:  # unknown name or options it needs (hosts): the closed form
        return _formula_in_degree(topology.lower(), p, dynamic)


def strategy_in_degree(strategy: Strategy) -> float:
    """The gossip in-degree of the strategy's own topology over its own ranks (hosts included)."""
    if strategy.gossip is None or strategy.world <= 1:
        return gossip_in_degree("exp2", strategy.world, False)
    try:
        from distlab.strategy.execution import for_strategy

        return _in_degree(for_strategy(strategy))
    except Exception:
        g = strategy.gossip
        return gossip_in_degree(g.topology, strategy.world, g.dynamic)
