"""Grids of (model, strategy, world, batch) runs: predict every one first, then measure.

``plan_grid`` / ``plan_configs`` predict a grid before anything runs and ``measure_grid`` runs it
on a Lab (``notebooks/bench/sweep.ipynb`` and ``cost-model-accuracy.ipynb``); its tidy table is
what ``distlab.costmodel.scoring`` scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from distlab.errors import DistlabError

if TYPE_CHECKING:
    from distlab.lab import Lab

MAX_STEPS = 3000  # measure_grid: the most steps min_seconds makes a run take (3 s of 1 ms steps)

Spec = str | tuple[str, dict[str, Any]]


def _spec(s: Spec) -> tuple[str, dict[str, Any]]:
    return (s, {}) if isinstance(s, str) else (s[0], dict(s[1]))


def plan_grid(
    resources: Any,
    cost_model: Any,
    models: Sequence[Spec],
    strategies: Sequence[Spec],
    batches: Sequence[int],
    profiles: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Build and predict every configuration on ``resources`` (pure: before anything runs).

    ``profiles``: a dict shared between calls (one per world size) so each model is profiled
    once and every world's predictions start from the same measurement.
    """
    import distlab as dl
    from distlab import zoo

    built = {}
    for model_spec in models:
        mname, mopts = _spec(model_spec)
        model = zoo.get(mname, **mopts)
        key = f"{mname}{sorted(mopts.items())}@{max(batches or [0])}"
        prof = (profiles or {}).get(key) or dl.profile(model, batch_size=max(batches or [1]))
        if profiles is not None:
            profiles[key] = prof
        built[mname] = (model, prof, None, None)
    return plan_configs(resources, cost_model, built, strategies, batches)


def plan_configs(
    resources: Any,
    cost_model: Any,
    built: dict[str, tuple[Any, Any, Any, Any]],
    strategies: Sequence[Spec],
    batches: Sequence[int],
) -> list[dict[str, Any]]:
    """Build and predict every configuration of models already built and profiled (pure).

    ``built``: ``{name: (model, profile, data, loss)}``; ``data`` and ``loss`` (None: synthetic
    data from the model, the default loss) are what ``measure_grid`` trains on.
    """
    import distlab as dl

    res, world = resources, resources.world
    if not batches:
        raise DistlabError("plan_grid: batches is empty; give at least one per-replica batch size")
    configs = []
    for mname, (model, prof, data, loss) in built.items():
        for strat_spec in strategies:
            bname, bopts = _spec(strat_spec)
            for batch in batches:
                try:
                    s = dl.strategy.build(bname, prof, res, batch_size=batch, **bopts)
                except DistlabError:
                    continue  # not applicable at this world size (e.g. gossip on one rank)
                pred = cost_model.predict(prof, res, s)
                configs.append(
                    {
                        "model": mname,
                        "strategy": s.name,
                        "builder": bname,
                        "world": world,
                        "batch": batch,
                        "predicted_throughput": pred.throughput,
                        "predicted_step_time": pred.step_time,
                        "grad_bytes": prof.param_bytes,
                        "_model": model,
                        "_strategy": s,
                        "_profile": prof,
                        "_data": data,
                        "_loss": loss,
                    }
                )
    return configs


def measure_grid(
    lab: Lab,
    configs: list[dict[str, Any]],
    *,
    steps: int,
    repeats: int,
    progress: Callable[[str], None] | None = None,
    first_repeat: int = 0,
    warmup: bool = True,
    min_seconds: float = 0.0,
) -> pd.DataFrame:
    """Run every configuration ``repeats`` times, round by round (interleaved), on ``lab``.

    Each run takes ``steps`` steps, or more where the configuration's ``predicted_step_time``
    says they would last under ``min_seconds`` (up to ``MAX_STEPS``), because a run of a few
    milliseconds a step is over before a slow moment of a shared machine is. Only the number of
    steps depends on the prediction, not what is measured.

    Rounds are numbered from ``first_repeat`` (the ``repeat`` column and the data's seed): a
    caller interleaving rounds across world sizes calls this once per round and world size.
    ``warmup``: first run each model once, unrecorded (its first configuration, a quarter of the
    steps), because a fresh Lab's first runs are slower than its later ones. Evidence for both:
    docs/cost-model.md §History and evidence."""
    if min_seconds < 0:
        raise DistlabError(
            f"measure_grid: min_seconds={min_seconds!r}; expected seconds >= 0 (0: always steps)"
        )

    if warmup:
        for c in {c["model"]: c for c in reversed(configs)}.values():
            _launch(lab, c, max(4, steps // 4), first_repeat)
    rows = []
    for rep in range(first_repeat, first_repeat + repeats):
        order = configs if rep % 2 == 0 else list(reversed(configs))
        for c in order:
            n = _steps_for(c, steps, min_seconds)
            run = _launch(lab, c, n, rep)
            m = run.metrics
            step_time = float(
                np.median(m.groupby("step")["step_time"].max().iloc[len(m["step"].unique()) // 4 :])
            )
            rows.append(
                {k: v for k, v in c.items() if not k.startswith("_")}
                | {
                    "repeat": rep,
                    "steps": n,
                    "measured_throughput": run.throughput,
                    "measured_step_time": step_time,
                }
            )
            if progress:
                progress(
                    f"{c['model']} {c['strategy']} w={c['world']} b={c['batch']}: {run.throughput:.0f}/s"
                )
    return pd.DataFrame(rows)


def _launch(lab: Lab, c: dict[str, Any], n: int, seed: int) -> Any:
    """One finished run of configuration ``c`` for ``n`` steps (its data drawn with ``seed``)."""
    import distlab as dl

    data = c.get("_data")
    if data is None:
        data = dl.data.synthetic(c["_model"], n=max(c["batch"] * c["world"] * 4, 256), seed=seed)
    run = lab.launch(
        c["_model"],
        strategy=c["_strategy"],
        steps=n,
        data=data,
        loss=c.get("_loss"),
        batch_size=c["batch"],
        seed=seed,
        elastic=False,  # training throughput: no checkpoints written during the measured steps
    )
    run.wait(progress=False)
    return run


def _steps_for(c: dict[str, Any], steps: int, min_seconds: float) -> int:
    """``steps``, or as many as last ``min_seconds`` at ``c``'s predicted step (up to MAX_STEPS)."""
    predicted = c.get("predicted_step_time", math.nan)
    if not min_seconds or not predicted > 0:
        return steps
    return max(steps, min(MAX_STEPS, math.ceil(min_seconds / predicted)))
