"""Fit the cost model to what calibration measured: microbenchmarks, local steps, training-loop runs.

Rows come from ``distlab.runtime.microbench.microbench_rank`` (one dict per measurement):
``collective`` (allreduce, reduce, broadcast, allgather, sendrecv, compute, optimizer, copy),
``world``, ``nbytes`` (per rank contribution for allgather), ``seconds`` (median), ``link``
(intra/inter); compute rows add ``alone``, ``ranks_on_host``, ``cores`` and ``threads``; optimizer
and copy rows ``alone`` (one rank at a time).
Each collective follows ``a(p) alpha + b(p) n beta`` with the Thakur et al. (2005) factors of
``collectives.py``, so one (alpha, beta) per collective and link explains every world size and
carries to world sizes not measured. The regression is robust (soft-L1 loss) against the
outliers a shared machine produces. ``fit_compute`` (local steps of reference models against
their profiles) and ``fit_overhead`` (the runtime's training loop against the prediction) fit the
rest; docs/cost-model.md lists every term.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from distlab.costmodel.collectives import COLLECTIVES, LINK_CLASSES, factors
from distlab.costmodel.params import CostParams
from distlab.errors import CalibrationError

_A_UNIT, _B_UNIT = 1e-6, 1e-9  # fit alpha in microseconds and beta in ns/byte: well-scaled unknowns


def fit_alpha_beta(
    world: np.ndarray, nbytes: np.ndarray, seconds: np.ndarray, collective: str
) -> tuple[float, float, float]:
    """Robust fit of ``seconds = a(p) alpha + b(p) n beta``; returns (alpha, beta, median relative error)."""
    a, b = factors(collective, world)
    X = np.column_stack([a * _A_UNIT, b * nbytes * _B_UNIT])
    if np.linalg.matrix_rank(X) < 2:
        raise CalibrationError(
            f"microbenchmarks[{collective}]: need at least two message sizes at a world size >= 2 to fit alpha and beta"
        )
    w = 1.0 / seconds  # relative residuals: small messages matter as much as large ones
    x0 = np.clip(np.linalg.lstsq(X * w[:, None], np.ones_like(seconds), rcond=None)[0], 1e-6, None)
    res = least_squares(lambda x: (X @ x) * w - 1.0, x0, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.1)
    rel = np.abs((X @ res.x) * w - 1.0)
    return float(res.x[0] * _A_UNIT), float(res.x[1] * _B_UNIT), float(np.median(rel))


def fit_contention(rows: Sequence[dict[str, Any]]) -> float | None:
    """Interference per extra busy core from compute rows (contention.py).

    Each row's all-busy over alone time, divided by time-slicing ``max(1, n t / c)``, is
    ``1 + contention (min(n, c) - 1)``; the median over rows is robust to a noisy one.
    """
    ks = []
    for r in rows:
        n = int(r.get("ranks_on_host") or r.get("world") or 1)
        c = int(r.get("cores") or n)
        t = int(r.get("threads") or 1)
        busy, alone = float(r["seconds"]), float(r.get("alone") or 0)
        if alone <= 0 or min(n, c) < 2:
            continue
        ks.append((busy / alone / max(1.0, n * t / c) - 1.0) / (min(n, c) - 1))
    return max(0.0, float(np.median(ks))) if ks else None


def fit_thread_efficiency(rows: Sequence[dict[str, Any]]) -> float | None:
    """Exponent e of ``time ~ threads ** -e`` from compute rows measured alone at different thread counts."""
    by_threads: dict[int, list[float]] = {}
    for r in rows:
        if r.get("threads") and float(r.get("alone") or 0) > 0:
            by_threads.setdefault(int(r["threads"]), []).append(float(r["alone"]))
    if len(by_threads) < 2:
        return None
    t = np.array(sorted(by_threads), dtype=float)
    secs = np.array([np.median(by_threads[int(k)]) for k in t])
    slope = np.polyfit(np.log(t), np.log(secs), 1)[0]
    return float(np.clip(-slope, 0.0, 1.0))


def fit_microbenchmarks(
    rows: Sequence[dict[str, Any]], base: CostParams
) -> tuple[CostParams, dict[str, Any]]:
    """All of the above: a new CostParams (unmeasured entries keep ``base``) and what was fitted."""
    rows = list(rows)
    if not rows:
        raise CalibrationError(
            "microbenchmarks: no rows; run lab.calibrate() on a cluster with at least 2 workers"
        )
    for i, r in enumerate(rows):
        missing = [k for k in ("collective", "world", "seconds") if k not in r]
        if missing:
            raise CalibrationError(
                f"microbenchmarks[{i}]: missing {missing}; rows come from microbench_rank()"
            )
    ab = dict(base.alpha_beta)
    errors: dict[str, float] = {}
    for coll in COLLECTIVES:
        for link in LINK_CLASSES:
            sel = [
                r
                for r in rows
                if r["collective"] == coll
                and r.get("link", "intra") == link
                and int(r["world"]) >= 2
                and float(r["seconds"]) > 0
            ]
            if len(sel) < 2:
                continue
            alpha, beta, err = fit_alpha_beta(
                np.array([float(r["world"]) for r in sel]),
                np.array([float(r["nbytes"]) for r in sel]),
                np.array([float(r["seconds"]) for r in sel]),
                coll,
            )
            ab[f"{coll}/{link}"] = (alpha, beta)
            errors[f"{coll}/{link}"] = err
    if not errors:
        raise CalibrationError(
            "microbenchmarks: no collective measured at a world size >= 2; calibrate needs 2 or more ranks"
        )
    compute = [r for r in rows if r["collective"] == "compute"]
    kappa, eff = fit_contention(compute), fit_thread_efficiency(compute)
    opt, copy = _per_byte(rows, "optimizer"), _per_byte(rows, "copy")
    params = base.with_(
        alpha_beta=ab,
        contention=base.contention if kappa is None else kappa,
        thread_efficiency=base.thread_efficiency if eff is None else eff,
        optimizer_per_byte=float(np.median(opt)) if opt else base.optimizer_per_byte,
        copy_per_byte=float(np.median(copy)) if copy else base.copy_per_byte,
    )
    info: dict[str, Any] = {"worlds": sorted({int(r["world"]) for r in rows}), "fit_error": errors}
    comp = [r for r in rows if r["collective"] == "compute" and r.get("flops") and float(r["seconds"]) > 0]
    if comp:  # compute speed per rank, alone and with every rank busy (largest world measured)
        last = max(comp, key=lambda r: int(r["world"]))
        info["flops_per_s_busy"] = float(last["flops"]) / float(last["seconds"])
        if float(last.get("alone") or 0) > 0:
            info["flops_per_s_alone"] = float(last["flops"]) / float(last["alone"])
    return params, info


def _per_byte(rows: Sequence[dict[str, Any]], collective: str) -> list[float]:
    """Seconds per byte of each ``collective`` row, one rank alone where measured (the model
    applies the contention of the world it predicts)."""
    return [
        float(r.get("alone") or r["seconds"]) / float(r["nbytes"])
        for r in rows
        if r["collective"] == collective and float(r.get("nbytes", 0)) > 0
    ]


def _bounded_fit(X: np.ndarray, y: np.ndarray, w: np.ndarray, lower: Sequence[float]) -> np.ndarray:
    """Weighted linear least squares with lower bounds, robust to a few outlying runs.

    Starts from the plain bounded solution (``lsq_linear``) and refines it with a soft-L1 loss
    (``least_squares``, residuals beyond 10% of a step count linearly, not squared): one
    reference run hit by a slow moment of a shared machine then moves the fit much less. A term
    no row exercises (an all-zero column) is left at 0.
    """
    from scipy.optimize import lsq_linear

    scale = np.abs(X).max(axis=0)  # unknowns of very different sizes (seconds per step, per byte): normalise
    used = scale > 0
    coef = np.zeros(X.shape[1])
    if used.any():
        A, b = (X[:, used] / scale[used]) * w[:, None], y * w
        lb = np.asarray(lower, dtype=float)[used] * scale[used]
        x0 = np.maximum(lsq_linear(A, b, bounds=(lb, np.inf)).x, lb + 1e-12)
        res = least_squares(lambda x: A @ x - b, x0, bounds=(lb, np.inf), loss="soft_l1", f_scale=0.1)
        coef[used] = res.x / scale[used]
    return coef


def fit_compute(params: CostParams, rows: Sequence[dict[str, Any]]) -> CostParams:
    """How a model's step in a rank compares with its profile, from local steps of reference models.

    Rows: ``measured`` (a local step, runtime.microbench.loop_pass_rank), ``profiled`` (the
    profile's forward + backward seconds at that batch), ``tensors``, ``ranks_on_host`` (n),
    ``cores`` (c) and ``profile_threads``. With ``base = profiled x slowdown(n, c)`` under
    ``params`` (contention and thread efficiency from the compute microbenchmark), fits::

        measured - base = step_overhead + tensor_overhead tensors + (compute_scale - 1) base
                          + d_contention (m - 1) base / (1 + contention (m - 1))
                          + oversubscription (n t / c - 1) base

    (``m = min(n, c)``) by bounded least squares on relative residuals: the profile may be
    faster or slower than a rank (compute_scale free above 0), the loop and the extra
    interference only cost. Models without measured local steps compute by these figures.
    """
    from distlab.costmodel.contention import slowdown, time_slicing

    rows = list(rows)
    if not rows:
        return params
    X, y, w = [], [], []
    for i, r in enumerate(rows):
        missing = [k for k in ("measured", "profiled", "tensors") if k not in r]
        if missing:
            raise CalibrationError(f"local steps[{i}]: missing {missing}; rows come from Lab.calibrate()")
        n = int(r.get("ranks_on_host") or 1)
        c = int(r.get("cores") or n)
        m, sliced = min(n, c), time_slicing(n, c)
        threads = int(r["profile_threads"]) if r.get("profile_threads") else None
        base = float(r["profiled"]) * slowdown(
            n, c, params.contention, threads, params.thread_efficiency, 0.0
        )
        X.append(
            [
                1.0,
                float(r["tensors"]),
                base,
                (m - 1) * base / (1.0 + params.contention * (m - 1)),
                (sliced - 1.0) * base,
            ]
        )
        y.append(float(r["measured"]) - base)
        w.append(1.0 / max(float(r["measured"]), 1e-9))
    coef = _bounded_fit(np.array(X), np.array(y), np.array(w), [0.0, 0.0, -0.95, 0.0, 0.0])
    return params.with_(
        step_overhead=float(coef[0]),
        tensor_overhead=float(coef[1]),
        compute_scale=params.compute_scale * (1.0 + float(coef[2])),
        contention=params.contention + float(coef[3]),
        oversubscription=float(coef[4]),
    )


def fit_overhead(params: CostParams, rows: Sequence[dict[str, Any]]) -> CostParams:
    """What the strategy's machinery costs in the training loop, from reference runs.

    Rows: ``world``, ``tensors`` (trainable tensors), ``measured`` and ``predicted`` step
    seconds (predicted by ``params`` without these terms, the reference model's compute taken
    from its measured local step) and, optionally, ``comm`` (the predicted communication on the
    wire, exposed), ``comm_alpha`` (the same with every beta at 0), ``calls`` (collective calls per step), ``gather_calls`` (those that gather sparse
    rows: the all-gather path's and the PS path's to its servers), ``sparse_units`` (sparse variables or shards), ``ps_units`` (dense
    variables or shards on the PS path), ``gossip_tensors`` (tensors gossiped per step, times the in-degree), ``ranks_on_host``
    and ``cores``. With ``s = n t / c`` (ranks taking turns per core), fits by bounded least
    squares on relative residuals (small steps weigh as much as large ones)::

        measured - predicted = runtime_overhead + rank_overhead (world - 1) + hook_overhead tensors
                               + (comm_scale - 1) (comm - comm_alpha) + (alpha_scale - 1) comm_alpha
                               + comm_oversubscription (s - 1) comm
                               + call_overhead calls + peer_call_overhead calls (world - 1) s
                               + sparse_unit_overhead sparse_units + ps_unit_overhead ps_units
                               + gather_peer_overhead gather_calls (world - 1) s
                               + gossip_tensor_overhead gossip_tensors

    every term non-negative except ``comm_scale`` and ``alpha_scale`` (a wire faster in training
    than measured), where ``comm_alpha`` is the part of ``comm`` that the latency terms make
    (``comm`` predicted with every beta at 0).
    """
    from distlab.costmodel.contention import time_slicing

    rows = list(rows)
    if not rows:
        return params
    X, y, w = [], [], []
    for i, r in enumerate(rows):
        missing = [k for k in ("world", "tensors", "measured", "predicted") if k not in r]
        if missing:
            raise CalibrationError(f"overhead runs[{i}]: missing {missing}; rows come from Lab.calibrate()")
        n = int(r.get("ranks_on_host") or r["world"])
        c = int(r.get("cores") or n)
        sliced = time_slicing(n, c)
        peers = float(r["world"]) - 1.0
        comm = float(r.get("comm") or 0.0)
        comm_alpha = min(float(r.get("comm_alpha") or 0.0), comm)
        gathers = float(r.get("gather_calls") or 0.0)
        X.append(
            [
                1.0,
                peers,
                float(r["tensors"]),
                comm - comm_alpha,
                comm * (sliced - 1.0),
                float(r.get("calls") or 0.0),
                float(r.get("calls") or 0.0) * peers * sliced,
                float(r.get("sparse_units") or 0.0),
                gathers * peers * sliced,
                float(r.get("gossip_tensors") or 0.0),
                comm_alpha,
                float(r.get("ps_units") or 0.0),
            ]
        )
        y.append(float(r["measured"]) - float(r["predicted"]))
        w.append(1.0 / max(float(r["measured"]), 1e-9))
    lower = [0.0] * 12
    lower[3] = lower[10] = -0.9  # comm_scale and alpha_scale down to 0.1
    coef = _bounded_fit(np.array(X), np.array(y), np.array(w), lower)
    return params.with_(
        runtime_overhead=float(coef[0]),
        rank_overhead=float(coef[1]),
        hook_overhead=float(coef[2]),
        comm_scale=params.comm_scale + float(coef[3]),
        alpha_scale=params.alpha_scale + float(coef[10]),
        comm_oversubscription=params.comm_oversubscription + float(coef[4]),
        call_overhead=float(coef[5]),
        peer_call_overhead=float(coef[6]),
        sparse_unit_overhead=float(coef[7]),
        gather_peer_overhead=float(coef[8]),
        gossip_tensor_overhead=float(coef[9]),
        ps_unit_overhead=float(coef[11]),
    )
