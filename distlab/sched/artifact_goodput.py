"""Pollux's per-job goodput model as its OSDI'21 artifact has it (``goodput.py``, ``speedup.py``), ported.

This is the model the artifact's policy sees: a step-time model with parameters fitted to what the
job has measured so far (``PerfParams``), gradient statistics for the statistical efficiency, and
the goodput-optimal batch and accumulation for each allocation. distlab's own step model is
``distlab.costmodel.fit``; this port is kept apart so the replay uses exactly the artifact's speedup
functions. Differences: numpy only (the artifact's autograd gradient is replaced by scipy's
finite differences in the fit), and no module-global numpy swapping.
"""

from __future__ import annotations

import contextlib
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import numpy as np
from scipy.optimize import Bounds, minimize

# T_compute = alpha_c + beta_c * atomic_bsz; T_network = alpha + beta * max(replicas - 2, 0) per link
# class (inter-node n, intra-node r); T_step = (T_compute^gamma + T_network^gamma)^(1/gamma)
PerfParams = namedtuple(
    "PerfParams", ["alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma"]
)
GradParams = namedtuple("GradParams", ["sqr", "var"])


class GoodputFunction:
    """Goodput = throughput x statistical efficiency for (nodes, replicas, atomic batch, accumulation)."""

    def __init__(self, perf_params: Any, grad_params: Any, init_batch_size: int) -> None:
        self.perf = PerfParams(*perf_params)
        self.grad = GradParams(*grad_params)
        self.init_batch_size = init_batch_size

    def evaluate(self, num_nodes: Any, num_replicas: Any, atomic_bsz: Any, accum_steps: Any) -> Any:
        batch_size = num_replicas * atomic_bsz * (accum_steps + 1)
        return self.throughput(num_nodes, num_replicas, atomic_bsz, accum_steps) * self.efficiency(batch_size)

    def throughput(self, num_nodes: Any, num_replicas: Any, atomic_bsz: Any, accum_steps: Any) -> Any:
        accum_time = predict_accum_time(self.perf, atomic_bsz)
        network_time = predict_network_time(self.perf, num_nodes, num_replicas)
        optim_time = np.exp(predict_log_optim_time(self.perf, accum_time, network_time))
        total_time = accum_steps * accum_time + optim_time
        return num_replicas * atomic_bsz * (accum_steps + 1) / total_time

    def efficiency(self, batch_size: Any) -> Any:
        # (PGNS + init_batch_size) / (PGNS + batch_size), PGNS = var / sqr * init_batch_size (Pollux eq. 5)
        scale = batch_size / self.init_batch_size
        denom = self.grad.var / scale + self.grad.sqr
        gain = np.where(denom > 0, (self.grad.var + self.grad.sqr) / np.where(denom > 0, denom, 1), 1.0)
        return gain / scale

    def optimize(
        self,
        num_nodes: Any,
        num_replicas: Any,
        max_batch_size: int | None = None,
        atomic_bsz_range: tuple[int | None, int | None] | None = None,
        accumulation: bool = False,
    ) -> tuple[Any, Any, Any]:
        """Best goodput over 50 batch sizes in geometric space, and its atomic batch and accumulation."""
        max_batch_size = max_batch_size or self.init_batch_size
        lo, hi = atomic_bsz_range or (None, None)
        min_atomic, max_atomic = lo or 1, hi or max_batch_size
        shape = np.broadcast(num_nodes, num_replicas).shape
        scalar = np.isscalar(num_nodes) or np.isscalar(num_replicas)
        num_nodes = np.broadcast_to(num_nodes, shape).flatten()
        num_replicas = np.broadcast_to(num_replicas, shape).flatten()
        min_batch_size = np.maximum(self.init_batch_size, min_atomic * num_replicas)
        batch_size = np.geomspace(min_batch_size, max_batch_size)
        local_bsz = batch_size / num_replicas
        eps = 1e-8
        if accumulation:
            accum_steps = np.ceil(local_bsz / max_atomic - eps) - 1
            # one replica above the initial batch accumulates at least once: the gradient statistics
            # need two micro-batches (the artifact's rule)
            one = np.logical_and(num_replicas == 1, local_bsz > self.init_batch_size + eps)
            accum_steps = np.where(one, np.maximum(accum_steps, 1), accum_steps).astype(int)
        else:
            accum_steps = np.zeros_like(local_bsz, dtype=int)
        atomic_bsz = np.ceil(local_bsz / (accum_steps + 1) - eps).astype(int)
        goodput = self.evaluate(num_nodes, num_replicas, atomic_bsz, accum_steps)
        goodput = np.where((min_atomic <= atomic_bsz) & (atomic_bsz <= max_atomic), goodput, 0.0)
        idx = np.argmax(goodput, axis=0), np.arange(goodput.shape[1])
        out = goodput[idx].reshape(shape), atomic_bsz[idx].reshape(shape), accum_steps[idx].reshape(shape)
        return tuple(x.item() for x in out) if scalar else out  # type: ignore[return-value]


class SpeedupFunction:
    """A job's speedup(nodes, replicas): optimised goodput there over optimised goodput on one replica."""

    def __init__(
        self,
        goodput_fn: GoodputFunction,
        max_batch_size: int,
        atomic_bsz_range: tuple[int, int],
        accumulation: bool = True,
    ) -> None:
        self.goodput_fn = goodput_fn
        self.kw = {"max_batch_size": max_batch_size, "atomic_bsz_range": atomic_bsz_range}
        self.accumulation = accumulation
        self.base = goodput_fn.optimize(1, 1, accumulation=accumulation, **self.kw)[0]
        self.memo: dict[tuple[int, int], float] = {}

    def __call__(self, num_nodes: Any, num_replicas: Any) -> Any:
        nodes = np.atleast_1d(np.asarray(num_nodes, dtype=int))
        replicas = np.atleast_1d(np.asarray(num_replicas, dtype=int))
        nodes, replicas = np.broadcast_arrays(nodes, replicas)
        missing = sorted({(int(n), int(r)) for n, r in zip(nodes, replicas) if (n, r) not in self.memo})
        if missing:
            n, r = np.array(missing).T
            goodput = np.zeros(len(missing))
            used = r > 0
            if used.any():
                goodput[used] = self.goodput_fn.optimize(
                    n[used], r[used], accumulation=self.accumulation, **self.kw
                )[0]
            self.memo.update(zip(missing, (goodput / self.base).tolist()))
        out = np.array([self.memo[int(a), int(b)] for a, b in zip(nodes, replicas)])
        return out.item() if np.isscalar(num_nodes) and np.isscalar(num_replicas) else out


def fit_perf_params(
    num_nodes: Any, num_replicas: Any, atomic_bsz: Any, accum_step_time: Any, optim_step_time: Any
) -> PerfParams:
    """Fit PerfParams to measured (accumulation, optimizer) step times, as the artifact does."""
    num_nodes, num_replicas, atomic_bsz = map(np.asarray, (num_nodes, num_replicas, atomic_bsz))
    accum_step_time, optim_step_time = np.asarray(accum_step_time), np.asarray(optim_step_time)
    params = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [1e-8, 1e-8] * 3 + [1.0]
    upper = [np.inf, np.inf] * 3 + [10.0]
    if len(np.unique(atomic_bsz)) == 1:
        # one atomic batch seen: split the compute time evenly between its constant and linear parts
        params[0] = upper[0] = lower[0] = float(np.mean(accum_step_time) / 2)
    fixed = []
    if not np.any(num_nodes > 1):
        fixed += [2, 3]  # no multi-node observation: inter-node terms stay at their floor
    if not np.any(np.logical_and(num_nodes == 1, num_replicas > 1)):
        fixed += [4, 5]
    if not np.any(num_replicas > 2):
        fixed += [3, 5]
    for i in fixed:
        params[i] = upper[i] = lower[i]
    args = (num_nodes, num_replicas, atomic_bsz, accum_step_time, optim_step_time)
    free = [i for i in range(7) if lower[i] != upper[i]]
    x0 = np.array(params, dtype=float)

    def objective(z: np.ndarray) -> tuple[float, np.ndarray]:
        x = x0.copy()
        x[free] = z
        value, grad = _objective(x, *args)
        return value, grad[free]

    with _one_blas_thread():
        result = minimize(
            objective,
            x0[free],
            jac=True,
            method="L-BFGS-B",
            bounds=Bounds(np.array([lower[i] for i in free]), np.array([upper[i] for i in free]), True),
        )
    x = x0.copy()
    x[free] = result.x
    if not np.any(num_nodes > 1):
        # prior: the inter-node link is no faster than the intra-node one
        x[2] = max(x[2], x[4] * 1.1)
        x[3] = max(x[3], x[5] * 1.1)
    return PerfParams(*x.tolist())


def _objective(
    params: Any, nodes: Any, replicas: Any, bsz: Any, accum: Any, optim: Any
) -> tuple[float, np.ndarray]:
    """The artifact's fitting loss and its gradient (the artifact differentiates it with autograd).

    Loss: RMS log error of the accumulation and optimizer step times, plus 1e-3 (gamma - 1)^2
    (a smaller gamma is easier to fit) and 1e-2 ((beta_n/alpha_n)^2 + (beta_r/alpha_r)^2) (prefer
    an optimistic scaling model).
    """
    ac, bc, an, bn, ar, br, g = params
    inter = nodes > 1
    intra = ~inter & (replicas > 1)
    m = np.maximum(replicas - 2, 1e-8)
    acc = ac + bc * bsz
    net = np.select([inter, intra], [an + bn * m, ar + br * m], 1e-8 + 1e-8 * m)
    total = acc**g + net**g
    log_optim = np.log(total) / g
    n = len(acc)
    r1 = np.log(acc) - np.log(accum)
    r2 = log_optim - np.log(optim)
    e1, e2 = np.sqrt(np.mean(r1**2)), np.sqrt(np.mean(r2**2))
    value = e1 + e2 + 1e-3 * (g - 1) ** 2 + 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
    d1 = r1 / (n * e1) if e1 > 0 else np.zeros(n)  # d e1 / d log(acc)
    d2 = r2 / (n * e2) if e2 > 0 else np.zeros(n)  # d e2 / d log_optim
    d_acc = d1 / acc + d2 * acc ** (g - 1) / total
    d_net = d2 * net ** (g - 1) / total
    d_g = d2 * (-np.log(total) / g**2 + (acc**g * np.log(acc) + net**g * np.log(net)) / (g * total))
    grad = np.array(
        [
            d_acc.sum(),
            (d_acc * bsz).sum(),
            (d_net * inter).sum() - 2e-2 * bn**2 / an**3,
            (d_net * inter * m).sum() + 2e-2 * bn / an**2,
            (d_net * intra).sum() - 2e-2 * br**2 / ar**3,
            (d_net * intra * m).sum() + 2e-2 * br / ar**2,
            d_g.sum() + 2e-3 * (g - 1),
        ]
    )
    return float(value), grad


@contextlib.contextmanager
def _one_blas_thread() -> Iterator[None]:
    # L-BFGS-B's tiny vector operations go to BLAS; with BLAS threads on shared cores each call
    # waits on spinning threads (7 ms a call measured on two shared cores), one thread does not
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover - scikit-learn brings it
        yield
        return
    global _CONTROLLER
    if _CONTROLLER is None:
        _CONTROLLER = ThreadpoolController()  # inspecting the loaded libraries takes ~5 ms: once
    with _CONTROLLER.limit(limits=1, user_api="blas"):
        yield


_CONTROLLER: Any = None


def predict_accum_time(p: PerfParams, atomic_bsz: Any) -> Any:
    return p.alpha_c + p.beta_c * atomic_bsz


def predict_log_optim_time(p: PerfParams, accum_time: Any, network_time: Any) -> Any:
    return np.log(accum_time**p.gamma + network_time**p.gamma) / p.gamma


def predict_network_time(p: PerfParams, num_nodes: Any, num_replicas: Any) -> Any:
    conds = [num_nodes > 1, num_replicas > 1]
    bottleneck = np.select(conds, [p.alpha_n, p.alpha_r], 1e-8)
    retrogress = np.select(conds, [p.beta_n, p.beta_r], 1e-8) * np.maximum(num_replicas - 2, 1e-8)
    return bottleneck + retrogress
