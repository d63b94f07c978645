"""Online refit: per-model factors on predicted compute and communication, fitted to measured runs.

A calibration is taken before the runs; the machine then drifts and each model's own step
differs from what the microbenchmarks suggest (datasets/measurements: 10-20% over the minutes
a prediction must hold). Finished runs measure it, so the cost model corrects itself from them
as Pollux refits its throughput model while jobs run: per model (``compute.model_key``) two
multiplicative factors, ``compute`` on the predicted compute and ``comm`` on the predicted
communication and optimizer, fitted so that ::

    measured_step ~ compute * predicted_compute + comm * (predicted_comm + predicted_optimizer)

on relative residuals ``predicted / measured - 1``: squared within ``HUBER``, linear beyond,
so that a few runs far off (a slow moment of a shared machine) do not drag the fit; each run
weighted by how recent it is (``HALFLIFE``); a ridge prior toward 1 (``PRIOR``); the factors
bounded to ``BOUNDS``. For one run the change of the factors is proportional to each
term's share of the run's step, so a run moves mostly the term that dominates it and leaves
the other near 1 (a run without communication leaves ``comm`` at exactly 1); the more runs,
the less the prior weighs.

Evidence for these settings: docs/cost-model.md, "Online refit".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from distlab.errors import CalibrationError

REQUIRED = ("model_key", "measured_step", "predicted_compute", "predicted_comm", "predicted_optimizer")
# weight of the prior, in runs: against one run whose predicted step is all one term and not far
# off, the fit goes 1 / (1 + PRIOR) of the way to explaining it exactly
PRIOR = 0.05
# runs of a model: a run's weight halves with every HALFLIFE later runs of the same model, since
# the machine drifts (either way, by 10-20% within a grid) and the latest runs say most about now
HALFLIFE = 32.0
HUBER = 0.2  # relative error beyond which a run counts linearly: about twice the run-to-run noise
BOUNDS = (0.2, 5.0)  # a factor outside these says the calibration is wrong, not that it drifted
# the parts of comm the simulator reports (Prediction.detail): scaled as comm is, so they still add up
COMM_PARTS = ("backward", "backward_total", "sparse", "broadcast", "gossip", "calls")
_ITERATIONS = 200  # reweighting passes of the robust fit; it settles in tens


@dataclass(frozen=True)
class Correction:
    """One model's refit: ``compute`` multiplies its predicted compute, ``comm`` its predicted comm and
    optimizer.

    ``runs``: the runs it was fitted to; ``error_before``/``error_after``: the median absolute
    relative error of the predicted step over those runs without and with the factors.
    """

    compute: float = 1.0
    comm: float = 1.0
    runs: int = 0
    error_before: float = math.nan
    error_after: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Correction:
        try:
            return cls(
                float(d["compute"]),
                float(d["comm"]),
                int(d.get("runs", 0)),
                float(d.get("error_before", math.nan)),
                float(d.get("error_after", math.nan)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CalibrationError(
                f"refit correction {dict(d)!r}: unreadable ({exc}); write it with CostModel.save()"
            ) from None


def usable_runs(runs: Any) -> Any:  # -> pandas.DataFrame
    """The runs a refit uses: required columns present, finished, every figure finite and positive.

    ``runs``: a DataFrame or a sequence of dicts, one per run. An empty table gives an empty
    frame; a non-empty one without a required column raises ``CalibrationError``.
    """
    import pandas as pd

    if isinstance(runs, Mapping):
        runs = [runs]
    df = runs if isinstance(runs, pd.DataFrame) else pd.DataFrame(list(runs or ()))
    if len(df) == 0:
        return pd.DataFrame(columns=list(REQUIRED))
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        names = ", ".join(repr(c) for c in missing)
        raise CalibrationError(
            f"runs: missing column{'s' if len(missing) > 1 else ''} {names}; pass lab.runs "
            "(runs launched after lab.calibrate(), with the prediction made before each)"
        )
    out = pd.DataFrame({c: pd.to_numeric(df[c], errors="coerce") for c in REQUIRED[1:]})
    out.insert(0, "model_key", df["model_key"])
    ok = out["model_key"].notna() & np.isfinite(out[list(REQUIRED[1:])]).all(axis=1)
    ok &= (out["measured_step"] > 0) & (out[list(REQUIRED[2:])] >= 0).all(axis=1)
    ok &= out[list(REQUIRED[2:])].sum(axis=1) > 0
    if "status" in df.columns:
        ok &= df["status"] == "finished"
    out = out[ok.to_numpy()].reset_index(drop=True)
    out["model_key"] = out["model_key"].astype(str)
    return out


def _objective(a: np.ndarray, b: np.ndarray, w: np.ndarray, s: tuple[float, float], prior: float) -> float:
    return float(
        np.sum(w * (a * s[0] + b * s[1] - 1.0) ** 2) + prior * ((s[0] - 1.0) ** 2 + (s[1] - 1.0) ** 2)
    )


def _ridge(
    a: np.ndarray, b: np.ndarray, w: np.ndarray, prior: float, bounds: tuple[float, float]
) -> tuple[float, float]:
    """Minimise ``sum(w (a s_c + b s_m - 1)^2) + prior ((s_c - 1)^2 + (s_m - 1)^2)`` over the box
    ``bounds``^2,
    exactly: the optimum is inside the box or on one of its edges, where it is that edge's
    one-variable optimum clipped."""
    lo, hi = bounds
    aa, ab, bb = float(np.sum(w * a * a)), float(np.sum(w * a * b)), float(np.sum(w * b * b))
    ta, tb = float(np.sum(w * a)), float(np.sum(w * b))
    sc, sm = np.linalg.solve(
        np.array([[aa + prior, ab], [ab, bb + prior]]), np.array([ta + prior, tb + prior])
    )
    if lo <= sc <= hi and lo <= sm <= hi:
        return float(sc), float(sm)
    candidates = []
    for edge in (lo, hi):
        candidates.append((float(np.clip((ta - ab * edge + prior) / (aa + prior), lo, hi)), edge))
        candidates.append((edge, float(np.clip((tb - ab * edge + prior) / (bb + prior), lo, hi))))
    return min(candidates, key=lambda s: _objective(a, b, w, s, prior))


def solve(
    compute: np.ndarray,
    comm: np.ndarray,
    measured: np.ndarray,
    weights: np.ndarray | None = None,
    prior: float = PRIOR,
    bounds: tuple[float, float] = BOUNDS,
) -> tuple[float, float]:
    """Factors ``(s_c, s_m)`` for runs with predicted ``compute`` and ``comm`` (+ optimizer) and ``measured``
    steps.

    Minimises ``sum(weights * huber(r)) + prior / 2 * ((s_c - 1)^2 + (s_m - 1)^2)`` over
    ``bounds``, with ``r = (s_c compute + s_m comm) / measured - 1`` and ``huber(r) = r^2 / 2``
    within ``HUBER``, linear beyond: iteratively reweighted ridge regressions, each exact on
    the box; the objective is convex, so they settle on its one minimum. Relative to the
    measured step a run far slower than predicted errs by at most -1, and the robust loss
    bounds one far faster; with every run within ``HUBER`` the fit is plain least squares.
    """
    c, m, y = (np.asarray(x, dtype=float) for x in (compute, comm, measured))
    a, b = c / y, m / y
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=float)
    s = _ridge(a, b, w, prior, bounds)
    for _ in range(_ITERATIONS):
        r = np.abs(a * s[0] + b * s[1] - 1.0)
        u = w * np.minimum(1.0, HUBER / np.maximum(r, 1e-300))
        new = _ridge(a, b, u, prior, bounds)
        if max(abs(new[0] - s[0]), abs(new[1] - s[1])) < 1e-12:
            return new
        s = new
    return s


def fit_corrections(
    runs: Any,
    prior: float = PRIOR,
    halflife: float | None = HALFLIFE,
    bounds: tuple[float, float] = BOUNDS,
) -> dict[str, Correction]:
    """Per model key, the factors that bring the predictions recorded in ``runs`` to what the runs measured.

    ``runs``: one row per finished run, in the order they ran, with ``model_key``
    (compute.model_key of its profile), ``measured_step`` (seconds: the slowest rank per step,
    median over steps) and the uncorrected prediction made before it, ``predicted_compute``,
    ``predicted_comm`` and ``predicted_optimizer`` (seconds); other columns (world,
    per_replica, strategy, ...) are ignored. Rows with a missing or non-positive figure, or a
    ``status`` other than "finished", are skipped; a model without a usable row gets no
    correction. ``halflife``: runs of a model after which a run's weight halves (None: all
    runs weigh the same).
    """
    if not (prior > 0 and math.isfinite(prior)):
        raise CalibrationError(f"refit: prior={prior!r}; expected a positive weight (default {PRIOR})")
    if halflife is not None and not halflife > 0:
        raise CalibrationError(
            f"refit: halflife={halflife!r}; expected runs > 0, or None to weigh every run alike"
        )
    lo, hi = bounds
    if not 0 < lo <= 1 <= hi:
        raise CalibrationError(f"refit: bounds={bounds!r}; expected (low, high) with 0 < low <= 1 <= high")
    df = usable_runs(runs)
    out: dict[str, Correction] = {}
    for key, part in df.groupby("model_key", sort=True):
        c = part["predicted_compute"].to_numpy(dtype=float)
        m = (part["predicted_comm"] + part["predicted_optimizer"]).to_numpy(dtype=float)
        y = part["measured_step"].to_numpy(dtype=float)
        age = np.arange(len(y))[::-1]  # later runs in the table, younger
        w = np.ones(len(y)) if halflife is None else 0.5 ** (age / float(halflife))
        sc, sm = solve(c, m, y, w, prior, bounds)
        out[str(key)] = Correction(
            sc,
            sm,
            len(part),
            float(np.median(np.abs((c + m) / y - 1.0))),
            float(np.median(np.abs((sc * c + sm * m) / y - 1.0))),
        )
    return out


def apply(out: Mapping[str, Any], compute: np.ndarray, comm: np.ndarray) -> dict[str, Any]:
    """Simulator output (arrays per quantity, one entry per prediction) with per-entry factors applied.

    ``compute`` multiplies ``compute``; ``comm`` multiplies ``comm``, ``optimizer`` and comm's
    parts; ``step_time`` is their sum again and ``throughput`` keeps its samples per step.
    Entries whose factors are both 1 keep their values bit for bit.
    """
    sc, sm = np.asarray(compute, dtype=float), np.asarray(comm, dtype=float)
    touched = (sc != 1.0) | (sm != 1.0)
    new = dict(out)
    new["compute"] = np.where(touched, out["compute"] * sc, out["compute"])
    for k in ("comm", "optimizer", *COMM_PARTS):
        if k in out:
            new[k] = np.where(touched, out[k] * sm, out[k])
    step = np.where(touched, new["compute"] + new["comm"] + new["optimizer"], out["step_time"])
    new["step_time"] = step
    if "throughput" in out:
        # samples per step are unchanged: throughput scales inversely with the step
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = out["throughput"] * out["step_time"] / step
        new["throughput"] = np.where(touched, scaled, out["throughput"])
    return new
