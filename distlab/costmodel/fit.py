"""Fit a structural step-time model to a table of measured runs (Pollux, Qiao et al. OSDI 2021, section 4.2).

Columns: ``num_nodes``, ``num_replicas``, ``local_bsz``, ``step_time`` and optionally
``grad_bytes``, ``accum_steps`` and ``cores_per_node`` (CPU ranks sharing a node's cores). The
model, not a curve, is what extrapolates to unseen world sizes:

- gradient computation is linear in the local batch: ``T_grad = c0 + c1 * local_bsz``; with
  ``cores_per_node`` c, the ``r = ceil(p / nodes)`` ranks of a node run ``t = max(1, c // r)``
  threads each and take turns when they outnumber the cores, so ``T_grad`` is multiplied by
  ``(c / t) ** eff * max(1, r t / c)`` (contention.py). ``eff`` (how compute scales with
  threads) is fitted when the rows include both a rank alone on its node and ranks sharing
  one; otherwise it stays at CostParams' default, 0.8;
- synchronisation is a ring all-reduce (Thakur et al. 2005) with alpha, beta per link class
  (intra-host when ``num_nodes == 1``, else inter-host):
  ``T_sync = 2(p-1) alpha + 2(p-1)/p * grad_bytes * beta`` and 0 on one replica;
- when the rows measure one replica count on more than one host count, so that the host count's
  own effect is identifiable, the inter-host bandwidth is fitted per host count
  (``beta_inter_<n>``, alpha_inter 0): measured clusters' all-reduce need not slow as hosts are
  added (Pollux's traces: two hosts cost more than three or four at the same replica count). A
  host count not measured takes the nearest measured one below it (above it when none is below);
- overlap is Pollux's gamma-norm, ``(T_grad^g + T_sync^g)^(1/g)`` with g >= 1 (1: none), and
  accumulation adds ``(accum_steps - 1) * T_grad`` of unoverlapped micro-batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.optimize import least_squares

from distlab.costmodel.params import CostParams
from distlab.errors import CalibrationError

NAMES = ("c0", "c1", "alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "gamma", "eff")
DEFAULT_EFF = 0.8
REQUIRED = ("num_nodes", "num_replicas", "local_bsz", "step_time")


def _columns(df: Any, need_time: bool) -> dict[str, np.ndarray]:
    import pandas as pd

    df = pd.DataFrame(df)
    need = REQUIRED if need_time else REQUIRED[:3]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise CalibrationError(
            f"measurements: missing columns {missing}; expected {list(REQUIRED)} (+ grad_bytes, accum_steps)"
        )
    n = len(df)
    cols = {c: df[c].to_numpy(dtype=float) for c in need}
    cols["grad_bytes"] = df["grad_bytes"].to_numpy(dtype=float) if "grad_bytes" in df.columns else np.ones(n)
    cols["accum_steps"] = (
        df["accum_steps"].to_numpy(dtype=float) if "accum_steps" in df.columns else np.ones(n)
    )
    cores = (
        df["cores_per_node"].to_numpy(dtype=float) if "cores_per_node" in df.columns else np.full(n, np.nan)
    )
    ranks = np.ceil(cols["num_replicas"] / np.maximum(cols["num_nodes"], 1))
    threads = np.maximum(1.0, np.floor(cores / np.maximum(ranks, 1)))
    known = np.isfinite(cores) & (cores > 0)
    cols["thread_ratio"] = np.where(known, cores / threads, 1.0)  # profile-alone threads / rank threads
    cols["sliced"] = np.where(known, np.maximum(1.0, ranks * threads / np.where(known, cores, 1.0)), 1.0)
    return cols


def host_classes(theta: dict[str, float]) -> list[int]:
    """The host counts with their own inter-host bandwidth in ``theta`` (empty: one inter-host class)."""
    return sorted(int(k.rsplit("_", 1)[1]) for k in theta if k.startswith("beta_inter_"))


def _beta_inter(theta: dict[str, float], nodes: np.ndarray) -> np.ndarray | float:
    classes = host_classes(theta)
    if not classes:
        return theta["beta_inter"]
    betas = np.array([theta[f"beta_inter_{c}"] for c in classes])
    # the nearest measured host count at or below each row's, else the smallest measured
    at = np.searchsorted(np.array(classes), np.asarray(nodes), side="right") - 1
    return betas[np.maximum(at, 0)]


def step_time(theta: dict[str, float], cols: dict[str, np.ndarray]) -> np.ndarray:
    """The structural model above for every row."""
    p, inter = cols["num_replicas"], cols["num_nodes"] > 1
    share = np.asarray(cols.get("thread_ratio", 1.0)) ** theta.get("eff", DEFAULT_EFF) * np.asarray(
        cols.get("sliced", 1.0)
    )
    t_grad = (theta["c0"] + theta["c1"] * cols["local_bsz"]) * share
    alpha = np.where(inter, theta["alpha_inter"], theta["alpha_intra"])
    beta = np.where(inter, _beta_inter(theta, cols["num_nodes"]), theta["beta_intra"])
    t_sync = np.where(
        p > 1, 2 * (p - 1) * alpha + 2 * (p - 1) / np.maximum(p, 1) * cols["grad_bytes"] * beta, 0.0
    )
    g = theta["gamma"]
    return (cols["accum_steps"] - 1) * t_grad + (t_grad**g + t_sync**g) ** (1 / g)


def _host_count_identifiable(cols: dict[str, np.ndarray]) -> bool:
    """Whether some replica count was measured on two or more host counts (both multi-host)."""
    multi = (cols["num_replicas"] > 1) & (cols["num_nodes"] > 1)
    seen: dict[float, set[float]] = {}
    for p, n in zip(cols["num_replicas"][multi].tolist(), cols["num_nodes"][multi].tolist()):
        seen.setdefault(p, set()).add(n)
    return any(len(v) > 1 for v in seen.values())


def fit_measurements(
    df: Any, by_hosts: bool | None = None
) -> tuple[CostParams, dict[str, float], dict[str, Any]]:
    """Robust fit (soft-L1 on log step time) of the identifiable parameters; others tie or stay out.

    ``by_hosts`` fits the inter-host bandwidth per host count (module docstring); None decides from
    the rows (whether they identify it), False keeps one inter-host class."""
    cols = _columns(df, need_time=True)
    y = cols["step_time"]
    if len(y) < 3 or np.any(y <= 0):
        raise CalibrationError("measurements: need at least 3 rows with positive step_time")
    multi = cols["num_replicas"] > 1
    has_inter = bool(np.any(multi & (cols["num_nodes"] > 1)))
    has_sync = bool(np.any(multi))
    scale = float(np.median(y))
    free = ["c0", "c1"] if len(np.unique(cols["local_bsz"])) > 1 else ["c0"]
    if has_sync:
        free += ["alpha_intra", "beta_intra"] if np.any(multi & (cols["num_nodes"] <= 1)) else []
        hosts = sorted({int(n) for n in cols["num_nodes"][multi & (cols["num_nodes"] > 1)]})
        if by_hosts is None:
            by_hosts = _host_count_identifiable(cols)
        if has_inter and by_hosts:
            free += [f"beta_inter_{n}" for n in hosts]
        elif has_inter:
            free += ["alpha_inter", "beta_inter"]
        free += ["gamma"]
    if np.any(cols["thread_ratio"] == 1.0) and np.any(cols["thread_ratio"] > 1.0):
        free += ["eff"]  # a rank alone and ranks sharing cores: how compute scales with threads
    start = {
        "c0": scale * 0.2,
        "c1": scale * 0.8 / max(np.median(cols["local_bsz"]), 1),
        "alpha_intra": scale * 0.01,
        "beta_intra": scale * 0.1 / max(np.median(cols["grad_bytes"]), 1),
        "gamma": 1.5,
        "eff": DEFAULT_EFF,
    }
    start["alpha_inter"], start["beta_inter"] = start["alpha_intra"], start["beta_intra"]
    start.update({n: start["beta_intra"] for n in free if n.startswith("beta_inter_")})

    def theta_of(x: np.ndarray) -> dict[str, float]:
        th = {"c1": 0.0, "alpha_intra": 0.0, "beta_intra": 0.0, "gamma": 1.0, "eff": DEFAULT_EFF}
        for name, v in zip(free, x):
            th[name] = float(v if name in ("gamma", "eff") else np.exp(v))
        per_host = host_classes(th)
        if per_host:  # the widest measured host count speaks for the inter-host class as a whole
            th["alpha_inter"], th["beta_inter"] = 0.0, th[f"beta_inter_{per_host[-1]}"]
        if "alpha_intra" not in free and has_inter:  # only multi-node data: intra figures tie to inter
            th["alpha_intra"], th["beta_intra"] = th["alpha_inter"], th["beta_inter"]
        th.setdefault("alpha_inter", th["alpha_intra"])
        th.setdefault("beta_inter", th["beta_intra"])
        return th

    linear = ("gamma", "eff")
    x0 = np.array([start[n] if n in linear else np.log(start[n]) for n in free])
    lo = np.array([{"gamma": 1.0, "eff": 0.0}.get(n, -60.0) for n in free])
    hi = np.array([{"gamma": 10.0, "eff": 1.0}.get(n, 20.0) for n in free])
    res = least_squares(
        lambda x: np.log(step_time(theta_of(x), cols)) - np.log(y),
        x0,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.05,
    )
    theta = theta_of(res.x)
    rel = np.abs(step_time(theta, cols) / y - 1)
    ab = {}
    if "grad_bytes" in getattr(df, "columns", ()):
        ab["allreduce/intra"] = (theta["alpha_intra"], theta["beta_intra"])
        ab["allreduce/inter"] = (theta["alpha_inter"], theta["beta_inter"])
    info = {
        "rows": int(len(y)),
        "free": free,
        "mape": float(rel.mean()),
        "worlds": sorted({int(p) for p in cols["num_replicas"]}),
        "inter_by_hosts": bool(host_classes(theta)),
    }
    return CostParams(alpha_beta=ab), theta, info


def predict_measurements(theta: dict[str, float], df: Any) -> np.ndarray:
    """Predicted step time (s) per row; ``step_time`` need not be present."""
    keep = {k: float(v) for k, v in theta.items() if k in NAMES or k.startswith("beta_inter_")}
    return step_time(keep, _columns(df, need_time=False))
