"""The run's periods: each step's (the last rank's end of it minus its end of the step before) and
each rank's own (its end of a step minus its own end of the step before)."""

from __future__ import annotations

from typing import Any

import numpy as np

from distlab.whatif.trace import TraceError


def periods(
    compute: dict[tuple[int, int], list[dict[str, Any]]], p: int, steps: list[int]
) -> dict[int, float]:
    """Each step's period: the last rank's end of it minus the last rank's end of the step before."""
    ends = {}
    for s in steps:
        last = [compute[(r, s)][-1]["end"] for r in range(p) if (r, s) in compute]
        if len(last) == p:
            ends[s] = max(last)
    periods = {s: ends[s] - ends[s - 1] for s in steps if s in ends and s - 1 in ends}
    if not periods:
        raise TraceError("the trace has no two consecutive steps on every rank; trace at least 3 steps")
    return periods


def own_periods(
    compute: dict[tuple[int, int], list[dict[str, Any]]], p: int, steps: list[int]
) -> list[dict[int, float]]:
    """Each rank's own period of each step: its end of the step minus its end of the step before."""
    out = []
    for r in range(p):
        ends = {s: compute[(r, s)][-1]["end"] for s in steps if (r, s) in compute}
        out.append({s: ends[s] - ends[s - 1] for s in steps if s in ends and s - 1 in ends})
    return out


def rank_periods(
    compute: dict[tuple[int, int], list[dict[str, Any]]], p: int, steps: list[int]
) -> np.ndarray:
    """Each rank's own median period (an asynchronous rank runs at its own pace; a synchronous
    one at the slowest's)."""
    return np.array(
        [float(np.median(list(d.values()))) if d else np.nan for d in own_periods(compute, p, steps)]
    )
