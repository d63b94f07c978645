"""What a ranking counts of convergence: the statistical cost g of a plan's staleness (steps to a
target loss relative to synchronous, ``Lab.probe_staleness``), how a plan is keyed to it, and the
note a plan carries when its g was not measured or was read as 1 (docs/consistency.md, "What the
ranking counts")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from distlab.errors import DistlabError

#: the note of a stale or asynchronous plan whose statistical cost g was not measured: its figure is
#: throughput alone, and ``lab.probe_staleness`` measures what it leaves out
UNCOUNTED = "convergence not counted: lab.probe_staleness"
ASYNC_GOSSIP = "async gossip"  # staleness_cost's key of asynchronous gossip (the probe runs PS only)


def key_of(strategy: Any) -> Any:
    """A strategy's staleness as ``staleness_cost`` keys it: 0 (synchronous: AllReduce, synchronous
    PS or gossip), s (stale-synchronous PS), ``"async"`` (asynchronous PS) or ``"async gossip"``."""
    gossip = getattr(strategy, "gossip", None)
    if gossip is not None and gossip.asynchronous:
        return ASYNC_GOSSIP
    sync, s = strategy.consistency
    return s if sync else "async"


def costs(staleness_cost: Mapping[Any, float] | None) -> dict[Any, float]:
    """``staleness_cost`` keyed as ``key_of`` keys plans (``None``, the builders' asynchronous
    staleness, read as ``"async"``); every g a positive number."""
    out: dict[Any, float] = {}
    for k, v in (staleness_cost or {}).items():
        g = float(v)
        if not g > 0 or g == float("inf"):
            raise DistlabError(
                f"staleness_cost[{k!r}]: {v!r} is not a positive finite number of steps relative to "
                "synchronous; pass what lab.probe_staleness returns"
            )
        out["async" if k is None else k] = g
    return out


def counted_g(strategy: Any, staleness_cost: Mapping[Any, float] | None) -> tuple[float, str]:
    """(g the ranking divides efficiency by, the note a row carries) for one plan. Synchronous
    plans: (1, ""). A stale or asynchronous plan without a measured g: (NaN, ``UNCOUNTED``...),
    unpriced, never silently free. A measured g below 1 counts as 1, with a note: staleness adds
    gradient error (Ho et al. 2013's SSP bound grows with s), so a probe that finds it faster per
    step measured something else. Under Adam the stale server's every push is a full optimizer
    step of one worker's gradient (runtime/stale_ps.py), ``world`` steps per synchronous step: an
    effective learning-rate change the synchronous plan could make too, not a gain of staleness."""
    key = key_of(strategy)
    if key == 0:
        return 1.0, ""
    label = {"async": "async", ASYNC_GOSSIP: ASYNC_GOSSIP}.get(key, f"s={key}")
    g = costs(staleness_cost).get(key)
    if g is None:
        if key == ASYNC_GOSSIP:
            return float("nan"), f"{UNCOUNTED} probes PS; staleness_cost['{ASYNC_GOSSIP}'] from your own runs"
        if not staleness_cost:
            return float("nan"), UNCOUNTED
        probe = "'async'" if key == "async" else str(key)
        return float("nan"), f"{UNCOUNTED}(staleness=({probe},)) measures g({label}), not probed"
    if g < 1.0:
        return 1.0, (
            f"g({label}) = {g:.2f} measured below 1, counted as 1: staleness is not credited with "
            "faster convergence (with Adam each stale push is a full step: a learning-rate change)"
        )
    return g, ""


def table_note(df: Any) -> str:
    """One line for a ranking's notes: how many plans' convergence is not counted ("" if none)."""
    notes = [str(n) for n in df.get("note", ()) if str(n).startswith(UNCOUNTED)]
    if not notes:
        return ""
    return (
        f"convergence not counted for {len(notes)} stale or asynchronous plan(s) (their note): "
        "g = lab.probe_staleness(model, data) measures it; rank with staleness_cost=g"
    )
