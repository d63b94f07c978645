"""Fit the cost model to what calibration measured: the fits that read each stage's rows.

The stages (docs/cost-model.md, ``Lab.calibrate()``) hand over typed rows (rows.py):
``CollectiveRow`` to ``fit_microbenchmarks``, ``ComputeFitRow`` to ``fit_compute`` and ``LoopRun``
to ``fit_overhead``; every fit also takes their dict forms (what calibrations store and cache).

Each collective follows ``a(p) alpha + b(p) n beta`` with the Thakur et al. (2005) factors of
``collectives.py``, so one (alpha, beta) per collective and link explains every world size and
carries to world sizes not measured. The regressions are robust (soft-L1 loss) against the
outliers a shared machine produces. ``fit_compute`` and ``fit_overhead`` are linear fits over a
table of named terms (``COMPUTE_TERMS``, ``OVERHEAD_TERMS``): a term's column, lower bound and
``CostParams`` field are one entry, and the fits' docstrings are written from the tables.

Long because every fit of the calibration's rows sits here beside the one bounded, robust solver
(with its priors) they share; each fit is a short function over its own rows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from distlab.costmodel.collectives import COLLECTIVES, LINK_CLASSES, factors
from distlab.costmodel.contention import slowdown, time_slicing
from distlab.costmodel.links import fit_shared_link, one_way_exchange
from distlab.costmodel.rows import CollectiveRow, ComputeFitRow, LoopRun, as_rows
from distlab.errors import CalibrationError

if TYPE_CHECKING:  # for annotations only
    from distlab.costmodel.params import CostParams
    from distlab.resources import ResourceSpec

_A_UNIT, _B_UNIT = 1e-6, 1e-9  # fit alpha in microseconds and beta in ns/byte: well-scaled unknowns


# -- microbenchmarks ----------------------------------------------------------------------
def fit_alpha_beta(
    world: np.ndarray, nbytes: np.ndarray, seconds: np.ndarray, collective: str
) -> tuple[float, float, float]:
    """Robust fit of ``seconds = a(p) alpha + b(p) n beta``; returns (alpha, beta, median relative error)."""
    from scipy.optimize import least_squares

    a, b = factors(collective, world)
    X = np.column_stack([a * _A_UNIT, b * nbytes * _B_UNIT])
    if np.linalg.matrix_rank(X) < 2:
        raise CalibrationError(
            f"microbenchmarks[{collective}]: need at least two message sizes at a world size >= 2 to fit "
            "alpha and beta"
        )
    w = 1.0 / seconds  # relative residuals: small messages matter as much as large ones
    x0 = np.clip(np.linalg.lstsq(X * w[:, None], np.ones_like(seconds), rcond=None)[0], 1e-6, None)
    res = least_squares(lambda x: (X @ x) * w - 1.0, x0, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.1)
    rel = np.abs((X @ res.x) * w - 1.0)
    return float(res.x[0] * _A_UNIT), float(res.x[1] * _B_UNIT), float(np.median(rel))


def fit_contention(rows: Sequence[CollectiveRow | Mapping[str, Any]]) -> float | None:
    """Interference per extra busy core from compute rows (contention.py).

    Each row's all-busy over alone time, divided by time-slicing ``max(1, n t / c)``, is
    ``1 + contention (min(n, c) - 1)``; the median over rows is robust to a noisy one.
    """
    ks = []
    for r in as_rows(CollectiveRow, rows):
        n = int(r.ranks_on_host or r.world or 1)
        c = int(r.cores or n)
        t = int(r.threads or 1)
        busy, alone = float(r.seconds), float(r.alone or 0)
        if alone <= 0 or min(n, c) < 2:
            continue
        ks.append((busy / alone / max(1.0, n * t / c) - 1.0) / (min(n, c) - 1))
    return max(0.0, float(np.median(ks))) if ks else None


def fit_thread_efficiency(rows: Sequence[CollectiveRow | Mapping[str, Any]]) -> float | None:
    """Exponent e of ``time ~ threads ** -e`` from compute rows measured alone at different thread counts."""
    by_threads: dict[int, list[float]] = {}
    for r in as_rows(CollectiveRow, rows):
        alone = float(r.alone or 0)
        if r.threads and alone > 0:
            by_threads.setdefault(int(r.threads), []).append(alone)
    if len(by_threads) < 2:
        return None
    t = np.array(sorted(by_threads), dtype=float)
    secs = np.array([np.median(by_threads[int(k)]) for k in t])
    slope = np.polyfit(np.log(t), np.log(secs), 1)[0]
    return float(np.clip(-slope, 0.0, 1.0))


def fit_microbenchmarks(
    rows: Sequence[CollectiveRow | Mapping[str, Any]], base: CostParams
) -> tuple[CostParams, dict[str, Any]]:
    """All of the above: a new CostParams (unmeasured entries keep ``base``) and what was fitted."""
    rows = list(rows)
    if not rows:
        raise CalibrationError(
            "microbenchmarks: no rows; run lab.calibrate() on a cluster with at least 2 workers"
        )
    rs = as_rows(CollectiveRow, rows)
    ab = dict(base.alpha_beta)
    errors: dict[str, float] = {}
    for coll in COLLECTIVES:
        for link in LINK_CLASSES:
            sel = [r for r in rs if r.collective == coll and r.link == link and int(r.world) >= 2]
            sel = np.array([(r.world, r.nbytes, r.seconds) for r in sel if r.seconds > 0], dtype=float)
            if len(sel) < 2:
                continue
            alpha, beta, errors[f"{coll}/{link}"] = fit_alpha_beta(sel[:, 0], sel[:, 1], sel[:, 2], coll)
            ab[f"{coll}/{link}"] = (alpha, beta)
    if not errors:
        raise CalibrationError(
            "microbenchmarks: no collective measured at a world size >= 2; calibrate needs 2 or more ranks"
        )
    exchange = one_way_exchange(ab)
    compute = [r for r in rs if r.collective == "compute"]
    kappa, eff = fit_contention(compute), fit_thread_efficiency(compute)
    opt, copy = _per_byte(rs, "optimizer"), _per_byte(rs, "copy")
    sgd = float(np.median(opt)) if opt else base.optimizer_per_byte
    work = {f"{k}_work": _per_byte(rs, f"optimizer:{k}") for k in ("momentum", "adam")}  # per SGD's byte
    shared = fit_shared_link(rs, ab.get("send/inter"))
    errors.update({f"{k}/inter": v for k, v in shared.pop("errors").items()})
    params = base.with_(
        **shared,
        alpha_beta=ab,
        contention=base.contention if kappa is None else kappa,
        thread_efficiency=base.thread_efficiency if eff is None else eff,
        optimizer_per_byte=sgd,
        **{k: float(np.median(w)) / sgd for k, w in work.items() if w},
        copy_per_byte=float(np.median(copy)) if copy else base.copy_per_byte,
    )
    info: dict[str, Any] = {"worlds": sorted({int(r.world) for r in rs}), "fit_error": errors}
    if exchange is not None:
        info["sendrecv_inter_measured"] = list(exchange)
    comp = [r for r in compute if r.flops and float(r.seconds) > 0]
    if comp:  # compute speed per rank, alone and with every rank busy (largest world measured)
        last = max(comp, key=lambda r: int(r.world))
        flops, alone = float(last.flops or 0), float(last.alone or 0)
        info["flops_per_s_busy"] = flops / float(last.seconds)
        if alone > 0:
            info["flops_per_s_alone"] = flops / alone
    return params, info


def fit_optimizer_tensors(rows: Sequence[CollectiveRow | Mapping[str, Any]]) -> dict[str, float]:
    """``CostParams`` per-tensor optimizer costs (``sgd_tensor``, ``momentum_tensor``,
    ``adam_tensor``) from ``optimizer_tensor:<kind>`` rows (seconds per tensor, each the median of
    its repeats): the median per kind; kinds not measured are left out."""
    found: dict[str, list[float]] = {}
    for r in as_rows(CollectiveRow, rows):
        kind = r.collective.removeprefix("optimizer_tensor:")
        if r.collective.startswith("optimizer_tensor:") and kind in ("sgd", "momentum", "adam"):
            found.setdefault(f"{kind}_tensor", []).append(max(float(r.seconds), 0.0))
    return {k: float(np.median(v)) for k, v in found.items()}


# a link is measured when sending this many bytes over it costs mostly bandwidth, not only latency
LINK_PROBE_BYTES, LINK_BYTES_SHARE = 16 << 20, 0.1


def check_links_measured(params: CostParams, info: Mapping[str, Any], resources: ResourceSpec) -> None:
    """On a cluster of several hosts, the link between them must have been measured, and its time
    must grow with the bytes sent: otherwise predictions would price it with the defaults (or as
    free) and rank every strategy as if the hosts were one."""
    hosts = list(resources.hosts)
    if len(hosts) < 2:
        return
    fitted = [k for k in info.get("fit_error", {}) if k.endswith("/inter")]
    between = f"between hosts {', '.join(hosts)}"
    if not fitted:
        raise CalibrationError(
            f"calibrate: the link {between} was not measured (no exchange crossed it); check that each "
            "host's workers reach the others on the address Dask knows them by (distlab binds gloo to it: "
            "GLOO_SOCKET_IFNAME overrides), then run lab.calibrate() again"
        )
    # the messages between two hosts measured for themselves, else every collective that crossed them
    probe = [k for k in ("send/inter", "sendrecv/inter") if k in fitted] or fitted
    shares = {}
    for k in probe:
        alpha, beta = params.alpha_beta[k]
        shares[k] = LINK_PROBE_BYTES * beta / (alpha + LINK_PROBE_BYTES * beta)
    if all(share < LINK_BYTES_SHARE for share in shares.values()):
        raise CalibrationError(
            f"calibrate: the link {between} could not be measured: the exchanges' time did not grow with "
            f"their size ({', '.join(sorted(shares))}: {LINK_PROBE_BYTES >> 20} MiB costs no more than a "
            "message's latency), so its bandwidth is unknown; stop other traffic on it and run "
            "lab.calibrate() again"
        )


def _per_byte(rows: Sequence[CollectiveRow], collective: str) -> list[float]:
    """Seconds per byte of each ``collective`` row, one rank alone where measured (the model
    applies the contention of the world it predicts)."""
    return [
        float(r.alone or r.seconds) / float(r.nbytes)
        for r in rows
        if r.collective == collective and float(r.nbytes) > 0
    ]


# -- linear fits over named terms ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Term:
    """One unknown of a linear calibration fit: the CostParams field it fits, its regressor (a
    column of the fit: how the formula writes it, and how a row computes it), its lower bound,
    and how the fitted coefficient meets the field's value before the fit: ``set`` replaces it,
    ``add`` adds to it (``d_field`` in the formula), ``scale`` multiplies it by ``1 + coefficient``
    (``(field - 1)``: the factor less one)."""

    param: str
    regressor: str
    column: Callable[[Any], float]
    lower: float = 0.0
    upper: float = float("inf")
    combine: Literal["set", "add", "scale"] = "set"
    prior: int = 0
    """Reference runs a prior toward the value before the fit is worth (``add`` and ``scale``
    terms: their coefficient 0): that many runs that saw the term's effect, at the run it moves
    most, as nothing. A term the rows barely pin then stays near the microbenchmark's figure
    instead of taking up whatever the noise of one calibration leaves (``contention`` came out
    0.08-0.47 in four calibrations of one day without one)."""

    @property
    def coefficient(self) -> str:
        return {"set": self.param, "add": f"d_{self.param}", "scale": f"({self.param} - 1)"}[self.combine]

    def apply(self, before: float, coef: float) -> float:
        if self.combine == "add":
            return before + coef
        if self.combine == "scale":
            return before * (1.0 + coef)
        return coef


def formula(lhs: str, terms: Sequence[Term], indent: int = 8) -> str:
    """``lhs = term + term + ...``, wrapped for a docstring: lines after the first indented by ``indent``."""
    parts = [f"{t.coefficient} {t.regressor}".strip() for t in terms]
    lines, line = [], f"{lhs} = {parts[0]}"
    for p in parts[1:]:
        if len(line) + len(p) + 3 > 96:
            lines.append(line)
            line = " " * (len(lhs) + 1) + "+ " + p
        else:
            line += " + " + p
    lines.append(line)
    return ("\n" + " " * indent).join(lines)


def bounds(terms: Sequence[Term]) -> str:
    """The terms' bounds in words."""
    free = [f"``{t.coefficient} >= {t.lower:g}``" for t in terms if t.lower != 0.0]
    capped = "".join(f", ``{t.coefficient} <= {t.upper:g}``" for t in terms if t.upper != float("inf"))
    return (f"every coefficient >= 0 but {', '.join(free)}" if free else "every coefficient >= 0") + capped


def _bounded_fit(
    X: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    lower: Sequence[float],
    prior: Sequence[int] = (),
    upper: Sequence[float] = (),
) -> np.ndarray:
    """Weighted linear least squares with lower bounds, robust to a few outlying runs.

    Starts from the plain bounded solution (``lsq_linear``) and refines it with a soft-L1 loss
    (``least_squares``, residuals beyond 10% of a step count linearly, not squared): one
    reference run hit by a slow moment of a shared machine then moves the fit much less. A term
    no row exercises (an all-zero column) is left at 0. ``prior[j]`` pseudo-rows per term pull
    its coefficient toward 0, each weighing as the row the term moves most (``Term.prior``).
    """
    from scipy.optimize import least_squares, lsq_linear

    scale = np.abs(X).max(axis=0)  # unknowns of very different sizes (seconds per step, per byte): normalise
    used = scale > 0
    coef = np.zeros(X.shape[1])
    if used.any():
        A, b = (X[:, used] / scale[used]) * w[:, None], y * w
        # each prior a row per pseudo-run: the term's largest effect on any row, toward none; in squares
        # (outside the robust loss, which would make it a constant pull)
        pulls = np.asarray(list(prior) or [0] * X.shape[1], dtype=float)[used]
        P = np.diag(np.sqrt(pulls) * np.abs(A).max(axis=0))[pulls > 0]
        lb = np.asarray(lower, dtype=float)[used] * scale[used]
        ub = np.asarray(list(upper) or [np.inf] * X.shape[1], dtype=float)[used] * scale[used]
        start = lsq_linear(np.vstack([A, P]), np.concatenate([b, np.zeros(len(P))]), bounds=(lb, ub))
        x0 = np.clip(start.x, lb + 1e-12, np.nextafter(ub, -np.inf))  # strictly inside the bounds

        def residuals(x: np.ndarray) -> np.ndarray:
            r = (A @ x - b) / _ROBUST
            # soft-L1 (least_squares' loss="soft_l1"): each residual whose square is its loss
            robust = np.sign(r) * _ROBUST * np.sqrt(2.0 * (np.sqrt(1.0 + r * r) - 1.0))
            return np.concatenate([robust, P @ x])

        if len(P):
            res = least_squares(residuals, x0, bounds=(lb, ub))
        else:  # the same loss, as least_squares applies it
            res = least_squares(lambda x: A @ x - b, x0, bounds=(lb, ub), loss="soft_l1", f_scale=_ROBUST)
        coef[used] = res.x / scale[used]
    return coef


def _fit_terms(
    params: CostParams,
    terms: Sequence[Term],
    points: Sequence[Any],
    y: Sequence[float],
    measured: Sequence[float],
) -> CostParams:
    """``params`` with ``terms`` fitted to ``y`` by ``_bounded_fit`` on relative residuals (each
    point weighs ``1 / measured``: small steps as much as large ones)."""
    X = np.array([[t.column(p) for t in terms] for p in points])
    w = np.array([1.0 / max(m, 1e-9) for m in measured])
    coef = _bounded_fit(
        X, np.array(y), w, [t.lower for t in terms], [t.prior for t in terms], [t.upper for t in terms]
    )
    return params.with_(**{t.param: t.apply(getattr(params, t.param), float(c)) for t, c in zip(terms, coef)})


_ROBUST = 0.1  # residuals beyond 10% of a step count linearly in the fits over named terms
# what a prior on a loop-fitted term weighs, in reference runs (Term.prior): a few of the stage's
# 20-70 rows, so a term the rows pin follows them and one they do not stays near the microbenchmarks'
PRIOR_RUNS = 2


class _StepPoint(NamedTuple):
    """A ComputeFitRow with what its terms share."""

    row: ComputeFitRow
    base: float  # profiled x slowdown(n, c) under the params before the fit
    n: int  # ranks on the host
    m: int  # busy cores: min(n, c)
    sliced: float  # ranks taking turns per core: n t / c
    contention: float  # the params' contention before the fit


COMPUTE_TERMS: tuple[Term, ...] = (
    Term("step_overhead", "", lambda p: 1.0),
    Term("lockstep_overhead", "(n > 1)", lambda p: float(p.n > 1)),
    Term("tensor_overhead", "tensors", lambda p: float(p.row.tensors)),
    Term("compute_scale", "base", lambda p: p.base, lower=-0.95, combine="scale"),
    Term(
        "contention",
        "(m - 1) base / (1 + contention (m - 1))",
        lambda p: (p.m - 1) * p.base / (1.0 + p.contention * (p.m - 1)),
        combine="add",
        prior=PRIOR_RUNS,
    ),
    Term("oversubscription", "(n t / c - 1) base", lambda p: (p.sliced - 1.0) * p.base),
)


def fit_compute(
    params: CostParams,
    rows: Sequence[ComputeFitRow | Mapping[str, Any]],
    terms: Sequence[Term] = COMPUTE_TERMS,
) -> CostParams:
    """How a model's step in a rank compares with its profile, from local steps of reference models.

    With ``base = profiled x slowdown(n, c)`` under ``params`` (contention and thread efficiency
    from the compute microbenchmark), ``n`` ranks on ``c`` cores and ``m = min(n, c)``, fits
    ``COMPUTE_TERMS``::

        {formula}

    by bounded least squares on relative residuals: the profile may be faster or slower than a
    rank, the loop and the extra interference only cost. Models without measured local steps
    compute by these figures (``terms``: a subset of the table, to fit fewer).
    Bounds: {bounds}.
    """
    rs = as_rows(ComputeFitRow, rows)
    if not rs:
        return params
    points = []
    for r in rs:
        n = int(r.ranks_on_host or 1)
        c = int(r.cores or n)
        threads = int(r.profile_threads) if r.profile_threads else None
        e = params.thread_efficiency if r.thread_efficiency is None else float(r.thread_efficiency)
        base = float(r.profiled) * slowdown(n, c, params.contention, threads, e, 0.0)
        points.append(_StepPoint(r, base, n, min(n, c), time_slicing(n, c), params.contention))
    measured = [float(r.measured) for r in rs]
    return _fit_terms(params, tuple(terms), points, [m - p.base for m, p in zip(measured, points)], measured)


class _LoopPoint(NamedTuple):
    """A LoopRun with what its terms share."""

    run: LoopRun
    peers: float  # world - 1
    sliced: float  # ranks taking turns per core: n t / c
    comm: float
    comm_alpha: float  # at most comm


OVERHEAD_TERMS: tuple[Term, ...] = (
    Term("runtime_overhead", "", lambda p: 1.0),
    Term("rank_overhead", "(world - 1)", lambda p: p.peers),
    Term("hook_overhead", "tensors", lambda p: float(p.run.tensors)),
    # a wire faster in training than measured: comm_scale and alpha_scale down to 0.1
    Term(
        "comm_scale",
        "(comm - comm_alpha)",
        lambda p: p.comm - p.comm_alpha,
        lower=-0.9,
        combine="add",
        prior=PRIOR_RUNS,
    ),
    # a CPU host's reductions take backward's cores: pinned by the reference whose buckets overlap
    # a long backward (calibration/campaign.py, OVERLAP); at most what the hidden tasks take
    # themselves (no overlap at all): beyond it a loaded machine's noise, not the overlap (1.4 and
    # 3.4 in two of three calibrations at load average 7-8 without the bound)
    Term("overlap_loss", "hidden", lambda p: p.run.hidden, combine="add", upper=1.0),
    Term("comm_oversubscription", "(s - 1) comm", lambda p: p.comm * (p.sliced - 1.0), combine="add"),
    Term("call_overhead", "calls", lambda p: float(p.run.calls or 0.0)),
    Term(
        "peer_call_overhead", "calls (world - 1) s", lambda p: float(p.run.calls or 0.0) * p.peers * p.sliced
    ),
    Term("sparse_unit_overhead", "sparse_units", lambda p: float(p.run.sparse_units or 0.0)),
    Term(
        "gather_peer_overhead",
        "gather_calls (world - 1) s",
        lambda p: float(p.run.gather_calls or 0.0) * p.peers * p.sliced,
    ),
    Term("gossip_tensor_overhead", "gossip_tensors", lambda p: float(p.run.gossip_tensors or 0.0)),
    Term("gossip_per_byte", "gossip_bytes", lambda p: float(p.run.gossip_bytes or 0.0)),
    Term("alpha_scale", "comm_alpha", lambda p: p.comm_alpha, lower=-0.9, combine="add", prior=PRIOR_RUNS),
    Term("ps_unit_overhead", "ps_units", lambda p: float(p.run.ps_units or 0.0)),
)


def fit_overhead(
    params: CostParams, rows: Sequence[LoopRun | Mapping[str, Any]], terms: Sequence[Term] = OVERHEAD_TERMS
) -> CostParams:
    """What the strategy's machinery costs in the training loop, from reference runs (``LoopRun``).

    With ``s = n t / c`` (ranks taking turns per core), fits ``OVERHEAD_TERMS``::

        {formula}

    by bounded least squares on relative residuals, small steps weighing as much as large ones
    (``terms``: a subset of the table, to fit fewer).
    Bounds: {bounds}.
    """
    rs = as_rows(LoopRun, rows)
    if not rs:
        return params
    points = []
    for r in rs:
        n = int(r.ranks_on_host or r.world)
        c = int(r.cores or n)
        comm = float(r.comm or 0.0)
        comm_alpha = min(float(r.comm_alpha or 0.0), comm)
        points.append(_LoopPoint(r, float(r.world) - 1.0, time_slicing(n, c), comm, comm_alpha))
    y = [float(r.measured) - float(r.predicted) for r in rs]
    return _fit_terms(params, tuple(terms), points, y, [float(r.measured) for r in rs])


if fit_compute.__doc__ and fit_overhead.__doc__:  # the formulas from the tables (absent under python -OO)
    fit_compute.__doc__ = fit_compute.__doc__.format(
        formula=formula("measured - base", COMPUTE_TERMS), bounds=bounds(COMPUTE_TERMS)
    )
    fit_overhead.__doc__ = fit_overhead.__doc__.format(
        formula=formula("measured - predicted", OVERHEAD_TERMS), bounds=bounds(OVERHEAD_TERMS)
    )
