"""Candidate enumeration: every builder with a sensible spread of options, deduplicated."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from distlab.errors import StrategyError
from distlab.strategy.builders import build
from distlab.strategy.types import Strategy

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec


def option_grid(profile: ModelProfile, resources: ResourceSpec) -> list[tuple[str, dict[str, Any]]]:
    """(builder, options) pairs worth predicting for this model on these resources."""
    world, n_hosts = resources.world, resources.num_hosts
    grid: list[tuple[str, dict[str, Any]]] = [("PS", {}), ("PSLoadBalancing", {})]
    if world > n_hosts:
        grid.append(("PSLoadBalancing", {"servers": "all"}))
    grid += [("PartitionedPS", {}), ("UnevenPartitionedPS", {})]
    if world > n_hosts:
        grid.append(("PartitionedPS", {"servers": "all"}))
    for chunk in (128, 32, 8):
        grid.append(("AllReduce", {"chunk_size": chunk}))
    grid += [("AllReduce", {"compressor": "fp16"}), ("AllReduce", {"compressor": "bf16"})]
    grid += [("PartitionedAR", {"chunk_size": c}) for c in (128, 32)]
    grid += [("RandomAxisPartitionAR", {"seed": s}) for s in (0, 1)]
    grid += [("Parallax", {"chunk_size": c}) for c in (128, 32)]
    if world >= 2:
        topologies: list[dict[str, Any]] = [{"topology": "exp2"}, {"topology": "ring"}]
        if world & (world - 1) == 0:
            topologies.append({"topology": "one_peer_exp2"})
        else:
            topologies.append({"topology": "exp2", "dynamic": True})
        if n_hosts > 1:
            topologies.append({"topology": "hierarchical"})
        for t in topologies:
            for mode in ("atc", "awc"):
                grid.append(("Gossip", {**t, "mode": mode}))
        if any(v.embedding for v in profile.variables):
            best = "one_peer_exp2" if world & (world - 1) == 0 else "exp2"  # BlueFog's recommended graph
            grid.append(("Gossip", {"topology": best, "sparse": "ps"}))
        if not any(v.sparse for v in profile.variables):  # asynchronous gossip (costmodel/gossip_pricing.py)
            graphs = ["exp2", "one_peer_exp2"] if world & (world - 1) == 0 else ["exp2"]
            grid += [("Gossip", {"topology": t, "asynchronous": True, "mode": "push_sum"}) for t in graphs]
            grid.append(("Gossip", {"topology": "exp2", "asynchronous": True, "mode": "average"}))
    if world >= 2:  # AutoDist's consistency: stale-synchronous and asynchronous PS (costmodel/consistency.py)
        spread = {"servers": "all"} if world > n_hosts else {}
        grid += [
            ("PSLoadBalancing", {**spread, **c})
            for c in ({"staleness": 1}, {"staleness": 4}, {"sync": False})
        ]
    grid.append(("AdaptiveBatch", {}))
    return grid


def plan_key(s: Strategy) -> str:
    """What makes two strategies the same plan (builder name and options aside)."""
    d = s.to_dict()
    d.pop("builder")
    return json.dumps(d, sort_keys=True)


def candidates(profile: ModelProfile, resources: ResourceSpec) -> list[Strategy]:
    """Every builder over its option grid; inapplicable combinations skipped, identical plans kept once."""
    out: dict[str, Strategy] = {}
    for name, opts in option_grid(profile, resources):
        try:
            s = build(name, profile, resources, **opts)
        except StrategyError:
            continue  # e.g. a topology that does not fit these hosts
        out.setdefault(plan_key(s), s)
    return list(out.values())
