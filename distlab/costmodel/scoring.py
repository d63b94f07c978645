"""How well predictions met measurements: scores of a measured grid's tidy table (``bench/grid.py``
measures it), and the score a perfect predictor would get against runs as noisy as these.

``accuracy``, ``accuracy_by_model``, ``noise_ceiling`` and ``leave_one_world_out`` are pure.
"""

from __future__ import annotations

import statistics

import numpy as np
import pandas as pd

from distlab.errors import DistlabError, check_positive


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
            rhos.append(float(spearmanr(part["predicted"], part["measured"])[0]))
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
        "noise_floor": float(np.median(noise[noise > 0]))
        if repeats_exist and (noise > 0).any()
        else float("nan"),
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
    check_positive("noise_ceiling: draws", draws)
    check_positive("noise_ceiling: repeats (None: as measured)", repeats, optional=True)
    keys = ["model", "strategy", "world", "batch"]
    runs = df[keys + ["measured_throughput"]].assign(
        log=np.log(df["measured_throughput"].to_numpy(dtype=float))
    )
    by_config = runs.groupby(keys, sort=False)
    n = by_config["log"].transform("size").to_numpy(dtype=float)
    if n.max(initial=0) < 2:
        raise DistlabError(
            "noise_ceiling: every configuration ran once; measure with repeats >= 2 to see the noise"
        )
    logs, mean = runs["log"].to_numpy(), by_config["log"].transform("mean").to_numpy()
    dev = np.where(n > 1, (logs - mean) * np.sqrt(n / np.maximum(n - 1, 1)), np.nan)
    truth = by_config["measured_throughput"].transform("median").to_numpy(dtype=float)
    pools = {
        g: d[~np.isnan(d)]
        for g, d in pd.Series(dev).groupby([runs["model"].to_numpy(), runs["world"].to_numpy()])
    }
    if repeats is not None:  # each configuration once, then ``repeats`` runs of it
        first = np.flatnonzero(~runs.duplicated(keys).to_numpy())
        runs, truth = runs.iloc[np.repeat(first, repeats)], np.repeat(truth[first], repeats)
    at = {
        g: np.flatnonzero((runs["model"].to_numpy() == g[0]) & (runs["world"].to_numpy() == g[1]))
        for g in pools
    }
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
                "num_nodes": 1,
                "num_replicas": part["world"],
                "local_bsz": part["batch"],
                "step_time": part["measured_step_time"],
                "grad_bytes": part["grad_bytes"],
            }
        )
        if cores_per_node:
            table["cores_per_node"] = cores_per_node
        for w in sorted(part["world"].unique()):
            train, test = table[table["num_replicas"] != w], table[table["num_replicas"] == w]
            if train["num_replicas"].nunique() < 2:
                continue
            pred = CostModel.fit(train).predict_table(test)
            errors[f"{model}_w{w}"] = float(
                np.mean(
                    np.abs(np.asarray(pred) - test["step_time"].to_numpy()) / test["step_time"].to_numpy()
                )
            )
    return errors
