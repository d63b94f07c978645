"""Accuracy judged on medians: configurations measured over interleaved rounds, each prediction scored
against its configuration's median, beside the ceiling a perfect predictor meets and the rounds' spread.

A single run of a configuration on a shared machine lies a few percent (up to tens of percent)
from the next one, so an error against one run mixes the predictor's miss with that noise. Here
every configuration runs ``rounds`` times, the rounds interleaved (round k over every
configuration, every other round in reverse order: a slow minute of the machine lands on every
configuration a little, not on one wholly), and the scores are:

- each prediction path's error against the configuration's **median** run (MAPE, max);
- the **ceiling**: the median itself, as a perfect predictor of it, scored against the single
  rounds (what a perfect predictor of the median would score against one run);
- the **spread**: each configuration's (max - min) / median over its rounds;
- per group (a model at a world size), the **regret** of the predicted best and whether the
  predicted best is the measured worst.

``score_rounds`` and ``interleaved`` are pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from distlab.errors import DistlabError

# the rule: a configuration's median is taken over at least this many rounds
MIN_ROUNDS = 5


def interleaved(n: int, rounds: int) -> Iterator[tuple[int, int]]:
    """``(round, configuration index)`` in the order to run them: every configuration once a
    round, every other round in reverse order."""
    if not isinstance(rounds, int) or rounds < 1:
        raise DistlabError(f"rounds={rounds!r}: give an integer >= 1 (>= {MIN_ROUNDS} for figures to report)")
    for k in range(rounds):
        for i in range(n) if k % 2 == 0 else reversed(range(n)):
            yield k, i


def score_rounds(
    runs: pd.DataFrame,
    predictions: Sequence[str],
    keys: Sequence[str] = ("model", "builder", "world"),
    group: Sequence[str] = ("model", "world"),
    measured: str = "measured",
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per-configuration table and the headline figures of ``runs`` (one row per configuration and
    round: ``keys``, the ``measured`` throughput and each prediction column in ``predictions``).

    Errors are relative to the measured median, ``|predicted / median - 1|``; the ceiling's are
    relative to each single round, ``|median / round - 1|``. Regret: per ``group``, ``1 - median
    of the predicted best / the best median``, the predicted best among ties being the first.
    """
    keys, group = list(keys), list(group)
    missing = [c for c in [*keys, measured, *predictions] if c not in runs.columns]
    if missing:
        raise DistlabError(
            f"score_rounds: runs lack the columns {missing}; each row is one round of one configuration"
        )
    if runs.empty:
        raise DistlabError("score_rounds: no runs; measure every configuration over rounds first")
    x = runs[measured].to_numpy(dtype=float)
    if not (x > 0).all():
        raise DistlabError(
            "score_rounds: a measured throughput is not positive; a run that failed has no figure"
        )
    by = runs.groupby(keys, sort=False)
    median = by[measured].transform("median").to_numpy(dtype=float)
    rows = by.agg(
        rounds=(measured, "size"),
        median=(measured, "median"),
        low=(measured, "min"),
        high=(measured, "max"),
        **{p: (p, "first") for p in predictions},
    ).reset_index()
    rows["spread"] = (rows["high"] - rows["low"]) / rows["median"]
    rows["ceiling_error"] = (
        pd.Series(np.abs(median / x - 1.0), index=runs.index)
        .groupby([runs[k] for k in keys], sort=False)
        .mean()
        .to_numpy()
    )
    summary: dict[str, Any] = {
        "configurations": len(rows),
        "rounds_min": int(rows["rounds"].min()),
        "rounds_enough": bool(rows["rounds"].min() >= MIN_ROUNDS),
        "ceiling_mape": float(np.mean(np.abs(median / x - 1.0))),
        "ceiling_max": float(np.max(np.abs(median / x - 1.0))),
        "spread_median": float(rows["spread"].median()),
        "spread_max": float(rows["spread"].max()),
    }
    for p in predictions:
        rows[f"{p}_error"] = rows[p] / rows["median"] - 1.0
        err = rows[f"{p}_error"].abs()
        summary[f"{p}_mape"] = float(err.mean())
        summary[f"{p}_max"] = float(err.max())
        regrets, worst_picked = [], 0
        for _, part in rows.groupby(group, sort=False):
            if len(part) < 2:
                continue
            picked = part.loc[part[p].idxmax(), "median"]
            regrets.append(float(1.0 - picked / part["median"].max()))
            worst_picked += bool(picked == part["median"].min())
        summary[f"{p}_regret_max"] = max(regrets) if regrets else float("nan")
        summary[f"{p}_picked_worst"] = worst_picked
    return rows, summary
