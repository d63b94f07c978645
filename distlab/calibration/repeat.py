"""How far a calibration's repeated stages agree, and the refusal to cache one whose repeats disagree.

A calibration repeats its noisy stages (the collectives, the reference models' local steps, the
training loop's short runs) and fits what they measured together: the collectives' points the mean
of their repeats (``mean_rows``), the loop's and the local steps' the median step over their
passes. Each stage's **spread** is the median, over the figures it measures, of
``(max - min) / median`` of a figure's repeats: for the collectives, each fitted collective's
predicted time of a ``PROBE_BYTES`` message on the whole cluster, one fit per repeat (what a
prediction reads, not the 4 KiB points' jitter); for the local steps and the loop, each run's time
per pass. A stage whose spread passes ``REPEAT_LIMIT`` would give a user who recalibrates other
predictions: the calibration serves the session and is not cached, as one taken under load is
not. All functions here are pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from distlab.costmodel.collectives import factors

# the collectives' stage runs this many times; each figure is the mean of its repeats
LINK_REPEATS = 3
# bytes of the message whose predicted time stands for a fitted collective (the size where the
# bandwidth term dominates, as in the gradients of a model of a few million parameters)
PROBE_BYTES = 4 << 20
# a stage whose repeats differ by more than this (median over its figures) is not cached: the issue's
# target is predictions of three calibrations within 15% of each other at worst, and a stage that
# moves by more than that between its own repeats cannot meet it
REPEAT_LIMIT = 0.15
# the row fields that name one microbenchmark point (the rest are its measurements)
_POINT = ("collective", "link", "world", "nbytes", "threads", "flows", "host", "ranks_on_host", "cores")
_MEASURED = ("seconds", "alone", "contention")


@dataclass(frozen=True)
class StageSpread:
    """One stage's repeatability: ``spread`` the median over its ``figures`` of each figure's
    ``(max - min) / median`` over ``repeats``; ``worst`` the largest, at ``worst_at``."""

    stage: str
    spread: float
    worst: float
    worst_at: str
    repeats: int
    figures: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"{self.stage}: {self.spread:.1%} (median of {self.figures} figures over {self.repeats} "
            f"repeats; worst {self.worst:.1%}, {self.worst_at})"
        )


def spread(values: Sequence[float]) -> float:
    """``(max - min) / median`` of ``values`` (0 for fewer than two or a median of 0)."""
    xs = [float(v) for v in values]
    if len(xs) < 2:
        return 0.0
    mid = statistics.median(xs)
    return (max(xs) - min(xs)) / mid if mid > 0 else 0.0


def stage_spread(stage: str, figures: Mapping[str, Sequence[float]]) -> StageSpread | None:
    """The stage's spread over the figures measured at least twice; None when none was."""
    repeated = {k: v for k, v in figures.items() if len(v) >= 2}
    if not repeated:
        return None
    each = {k: spread(v) for k, v in repeated.items()}
    worst_at = max(each, key=lambda k: each[k])
    return StageSpread(
        stage=stage,
        spread=float(statistics.median(each.values())),
        worst=each[worst_at],
        worst_at=worst_at,
        repeats=max(len(v) for v in repeated.values()),
        figures=len(repeated),
    )


def mean_rows(repeats: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The microbenchmark rows of several repeats as one: each point's measurements the mean of
    its repeats (a point one repeat lacks, e.g. a size past a repeat's time budget, keeps the
    others'). The mean, as each repeat's points are (``runtime.microbench._max_mean``): a step
    pays the mix of the machine's fast and slow moments, which a median of three picks one of."""
    points: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for rows in repeats:
        for r in rows:
            points.setdefault(tuple(r.get(k) for k in _POINT), []).append(r)
    out = []
    for rows in points.values():
        row = dict(rows[0])
        for k in _MEASURED:
            vals = [float(r[k]) for r in rows if r.get(k) is not None]
            if vals:
                row[k] = float(np.mean(vals))
        out.append(row)
    return out


def link_figures(params: Sequence[Any], world: int) -> dict[str, list[float]]:
    """Per fitted collective and link (``"allreduce/intra"``), its predicted seconds for a
    ``PROBE_BYTES`` message on ``world`` ranks (two for a point-to-point message) under each
    repeat's fitted ``params`` (CostParams); and ``"compute slowdown"``: every core busy against
    one, under each repeat's fitted contention (``1 + contention (world - 1)``)."""
    out: dict[str, list[float]] = {}
    keys = set.intersection(*(set(p.alpha_beta) for p in params)) if params else set()
    for key in sorted(keys):
        coll = key.split("/")[0]
        p = 2 if coll in ("send", "sendrecv") else world
        a, b = factors(coll, p)
        out[key] = [float(a * q.alpha_beta[key][0] + b * PROBE_BYTES * q.alpha_beta[key][1]) for q in params]
    if world > 1:
        out["compute slowdown"] = [1.0 + float(q.contention) * (world - 1) for q in params]
    return out


def pass_figures(per_pass: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """The figures of a stage measured pass by pass (each a run's seconds per pass), positive only."""
    return {k: [float(v) for v in vs if v and v > 0] for k, vs in per_pass.items()}


def unrepeatable(spreads: Sequence[StageSpread], limit: float = REPEAT_LIMIT) -> StageSpread | None:
    """The stage that repeats worst, when its spread passes ``limit``; None when every stage repeats."""
    over = [s for s in spreads if s.spread > limit]
    return max(over, key=lambda s: s.spread) if over else None


def refusal(stage: StageSpread, limit: float = REPEAT_LIMIT) -> str:
    """The one line a calibration that did not repeat warns with."""
    return (
        f"calibrate: the {stage.stage} stage did not repeat: its {stage.repeats} repeats differ by "
        f"{stage.spread:.0%} (median of {stage.figures} figures; the worst, {stage.worst_at}, by "
        f"{stage.worst:.0%}; the limit is {limit:.0%}), so another calibration would predict otherwise; "
        "this one serves this session and is not cached: stop other work on the machine and run "
        "lab.calibrate() again"
    )


def warn_unrepeatable(spreads: Sequence[Mapping[str, Any]], said: bool = False) -> StageSpread | None:
    """The stage past ``REPEAT_LIMIT`` among a calibration's ``spreads`` (fingerprint form), warned
    in one ``CalibrationWarning`` line unless ``said`` (a load warning already said why not cached)."""
    import warnings

    from distlab.cluster.load import CalibrationWarning

    worst = unrepeatable([StageSpread(**d) for d in spreads], REPEAT_LIMIT)
    if worst is not None and not said:
        warnings.warn(refusal(worst, REPEAT_LIMIT), CalibrationWarning, stacklevel=4)
    return worst
