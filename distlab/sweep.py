"""Grids of (model, strategy, world, batch) runs: predict every one first, then measure, then score.

``plan_grid`` / ``plan_configs`` predict a grid before anything runs and ``measure_grid`` runs
it (``notebooks/bench/sweep.ipynb`` and ``cost-model-accuracy.ipynb``); the scoring functions
(``accuracy``, ``accuracy_by_model``, ``noise_ceiling``, ``leave_one_world_out``) are pure and
work on its tidy table.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from distlab.errors import DistlabError

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
                        "model": mname, "strategy": s.name, "builder": bname, "world": world, "batch": batch,
                        "predicted_throughput": pred.throughput, "predicted_step_time": pred.step_time,
                        "grad_bytes": prof.param_bytes, "_model": model, "_strategy": s, "_profile": prof,
                        "_data": data, "_loss": loss,
                    }
                )
    return configs


def measure_grid(
    lab: Any,
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
    docs/cost-model.md §History and evidence.
    """
    import distlab as dl

    if min_seconds < 0:
        raise DistlabError(f"measure_grid: min_seconds={min_seconds!r}; expected seconds >= 0 (0: always steps)")

    def launch(c: dict[str, Any], n: int, seed: int) -> Any:
        data = c.get("_data")
        if data is None:
            data = dl.data.synthetic(c["_model"], n=max(c["batch"] * c["world"] * 4, 256), seed=seed)
        run = lab.launch(
            c["_model"], strategy=c["_strategy"], steps=n, data=data, loss=c.get("_loss"), batch_size=c["batch"],
            seed=seed, elastic=False,  # training throughput: no checkpoints written during the measured steps
        )
        run.wait(progress=False)
        return run

    def steps_of(c: dict[str, Any]) -> int:
        predicted = c.get("predicted_step_time", math.nan)
        if not min_seconds or not predicted > 0:
            return steps
        return max(steps, min(MAX_STEPS, math.ceil(min_seconds / predicted)))

    if warmup:
        for c in {c["model"]: c for c in reversed(configs)}.values():
            launch(c, max(4, steps // 4), first_repeat)
    rows = []
    for rep in range(first_repeat, first_repeat + repeats):
        order = configs if rep % 2 == 0 else list(reversed(configs))
        for c in order:
            n = steps_of(c)
            run = launch(c, n, rep)
            m = run.metrics
            step_time = float(np.median(m.groupby("step")["step_time"].max().iloc[len(m["step"].unique()) // 4 :]))
            rows.append(
                {k: v for k, v in c.items() if not k.startswith("_")}
                | {"repeat": rep, "steps": n, "measured_throughput": run.throughput, "measured_step_time": step_time}
            )
            if progress:
                progress(f"{c['model']} {c['strategy']} w={c['world']} b={c['batch']}: {run.throughput:.0f}/s")
    return pd.DataFrame(rows)


def accuracy(df: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per-configuration errors and the headline figures.

    The noise floor is the median over pairs of repeats of a configuration of ``|a - b| / (a + b)``
    (with two repeats: each one's relative deviation from their median; comparable whatever
    the number of repeats, which deviations from a median of three are not: they leave the
    middle one out): an error below it cannot be told from re-running. Regret: the throughput lost by
    running the predicted best strategy instead of the measured best, per (model, world, batch).
    Strategies the model predicts exactly alike (the same work: every builder on one rank, or
    Parallax and AllReduce on a model without sparse variables) are one choice to it: the
    regret is the mean over them (picking one of the tie at random), not whichever comes first
    (``regret_first_max`` keeps that figure: it is set by noise between runs of the same work).
    """
    from scipy.stats import spearmanr

    keys = ["model", "strategy", "world", "batch"]
    g = df.groupby(keys, as_index=False).agg(
        predicted=("predicted_throughput", "first"), measured=("measured_throughput", "median")
    )
    g["error"] = (g["predicted"] - g["measured"]).abs() / g["measured"]
    pairs = []
    for _, runs in df.groupby(keys)["measured_throughput"]:
        x = runs.to_numpy(dtype=float)
        i, j = np.triu_indices(len(x), k=1)
        pairs.append(np.abs(x[i] - x[j]) / (x[i] + x[j]))
    noise = np.concatenate(pairs) if pairs else np.zeros(0)
    rhos, regrets = [], []
    for _, part in g.groupby(["model", "world"]):
        if len(part) >= 3 and part["measured"].nunique() > 1:
            rhos.append(spearmanr(part["predicted"], part["measured"]).statistic)
    first = []
    for _, part in g.groupby(["model", "world", "batch"]):
        best = part["measured"].max()
        tied = part[np.isclose(part["predicted"], part["predicted"].max(), rtol=1e-9, atol=0.0)]
        regrets.append(float((1 - tied["measured"] / best).mean()))
        first.append(1 - part.loc[part["predicted"].idxmax(), "measured"] / best)
    repeats_exist = df.groupby(keys).size().max() > 1
    summary = {
        "configs": float(len(g)),
        "mape": float(g["error"].mean()),
        "p90_error": float(g["error"].quantile(0.9)),
        "max_error": float(g["error"].max()),
        "noise_floor": float(np.median(noise[noise > 0])) if repeats_exist and (noise > 0).any() else float("nan"),
        "spearman_median": float(statistics.median(rhos)) if rhos else float("nan"),
        "spearman_min": float(min(rhos)) if rhos else float("nan"),
        "regret_median": float(statistics.median(regrets)) if regrets else float("nan"),
        "regret_max": float(max(regrets)) if regrets else float("nan"),
        "regret_first_max": float(max(first)) if first else float("nan"),
    }
    return g, summary


def accuracy_by_model(df: pd.DataFrame) -> pd.DataFrame:
    """``accuracy``'s headline figures per model (one row each), beside its run-to-run noise floor."""
    rows = [{"model": m, **accuracy(part)[1]} for m, part in df.groupby("model", sort=True)]
    return pd.DataFrame(rows).set_index("model")


def noise_ceiling(
    df: pd.DataFrame, draws: int = 200, seed: int = 0, repeats: int | None = None
) -> dict[str, float]:
    """What a perfect predictor would score against measurements as noisy as these: the ceiling
    the machine's run-to-run noise sets on ``accuracy``'s headline figures.

    Each configuration's true throughput is taken to be its measured median. A draw measures
    every configuration again as many times as it ran (or ``repeats`` times: how many runs
    would make the targets checkable), each run the truth times a deviation
    resampled from the runs of the same (model, world) (a run's log deviation from its
    configuration's mean log, times sqrt(n / (n - 1)) for the mean it was taken from), and scores
    the truth as the prediction by ``accuracy``'s rules. Returns the median over ``draws`` of
    MAPE, Spearman (median and minimum) and regret (median and maximum), and the share of draws
    in which the minimum Spearman reaches 0.9 and the maximum regret stays within 5% (the
    issue's targets). Optimistic for the predictor: measured medians lie further apart than
    the truths they estimate, and configurations doing the same work are not tied.
    """
    if not isinstance(draws, int) or draws < 1:
        raise DistlabError(f"noise_ceiling: draws={draws!r}; expected an integer >= 1")
    if repeats is not None and (not isinstance(repeats, int) or repeats < 1):
        raise DistlabError(f"noise_ceiling: repeats={repeats!r}; expected an integer >= 1, or None (as measured)")
    keys = ["model", "strategy", "world", "batch"]
    runs = df[keys + ["measured_throughput"]].assign(log=np.log(df["measured_throughput"].to_numpy(dtype=float)))
    by_config = runs.groupby(keys, sort=False)
    n = by_config["log"].transform("size").to_numpy(dtype=float)
    if n.max(initial=0) < 2:
        raise DistlabError("noise_ceiling: every configuration ran once; measure with repeats >= 2 to see the noise")
    logs, mean = runs["log"].to_numpy(), by_config["log"].transform("mean").to_numpy()
    dev = np.where(n > 1, (logs - mean) * np.sqrt(n / np.maximum(n - 1, 1)), np.nan)
    truth = by_config["measured_throughput"].transform("median").to_numpy(dtype=float)
    pools = {g: d[~np.isnan(d)] for g, d in pd.Series(dev).groupby([runs["model"].to_numpy(), runs["world"].to_numpy()])}
    if repeats is not None:  # each configuration once, then ``repeats`` runs of it
        first = np.flatnonzero(~runs.duplicated(keys).to_numpy())
        runs, truth = runs.iloc[np.repeat(first, repeats)], np.repeat(truth[first], repeats)
    at = {g: np.flatnonzero((runs["model"].to_numpy() == g[0]) & (runs["world"].to_numpy() == g[1])) for g in pools}
    rng = np.random.default_rng(seed)
    figures = []
    for _ in range(draws):
        noise = np.zeros(len(runs))
        for g, rows in at.items():
            if len(pools[g]):
                noise[rows] = rng.choice(pools[g], size=len(rows))
        sim = runs[keys].assign(predicted_throughput=truth, measured_throughput=truth * np.exp(noise))
        figures.append(accuracy(sim)[1])
    f = pd.DataFrame(figures)
    return {
        "ceiling_mape": float(f["mape"].median()),
        "ceiling_spearman_median": float(f["spearman_median"].median()),
        "ceiling_spearman_min": float(f["spearman_min"].median()),
        "ceiling_regret_median": float(f["regret_median"].median()),
        "ceiling_regret_max": float(f["regret_max"].median()),
        "ceiling_share_spearman_min_met": float((f["spearman_min"] >= 0.9).mean()),
        "ceiling_share_regret_max_met": float((f["regret_max"] <= 0.05).mean()),
    }


def leave_one_world_out(
    df: pd.DataFrame, builder: str = "AllReduce", cores_per_node: int | None = None
) -> dict[str, float]:
    """Error of ``CostModel.fit`` predicting each world size from the others (per model).

    ``cores_per_node``: the cores the ranks shared (the fit then models threads and
    time-slicing, as on the embedded cluster); None leaves it to Pollux's plain model.
    """
    from distlab.costmodel import CostModel

    errors: dict[str, float] = {}
    sub = df[df["builder"] == builder]
    for model, part in sub.groupby("model"):
        table = pd.DataFrame(
            {
                "num_nodes": 1, "num_replicas": part["world"], "local_bsz": part["batch"],
                "step_time": part["measured_step_time"], "grad_bytes": part["grad_bytes"],
            }
        )
        if cores_per_node:
            table["cores_per_node"] = cores_per_node
        for w in sorted(part["world"].unique()):
            train, test = table[table["num_replicas"] != w], table[table["num_replicas"] == w]
            if train["num_replicas"].nunique() < 2:
                continue
            pred = CostModel.fit(train).predict_table(test)
            errors[f"{model}_w{w}"] = float(np.mean(np.abs(np.asarray(pred) - test["step_time"].to_numpy()) / test["step_time"].to_numpy()))
    return errors
