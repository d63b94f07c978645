"""(rank) The calibration's compute rows: a GEMM alone and with every rank busy (contention), the
optimizers' and a bucket copy's cost per byte with their bytes out of cache, and the timing helpers
the collectives share (``time_reps``). Split from microbench.py, which measures the collectives and
calls ``rank_compute_rows`` after them; the rows' schema is ``costmodel.rows.CollectiveRow``."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from distlab.resources import available_cores

# optimizers timed beside plain SGD (their cost per byte relative to it: CostParams.optimizer_work)
OPTIMIZER_KINDS = ("momentum", "adam")
GEMM_N, GEMM_ITERS = 256, 12  # fixed compute workload: 12 GEMMs of 256x256 (0.4 GFLOP)
OPT_NUMEL = 1 << 21  # 8 MiB of float32 parameters for the optimizer-update row
COPY_NUMEL, COPY_PARTS = 1 << 19, 4  # 2 MiB gathered from 4 tensors: a bucket's flatten (torch.cat)
# Each optimizer and copy repeat first reads a buffer larger than a server's last-level cache: in a
# training step the step's other work evicts the bytes these touch once per step, and timed hot
# they come out several times faster (evidence: docs/cost-model.md §History and evidence).
EVICT_NUMEL = 1 << 24  # 64 MiB of float32
# each per-byte figure (the optimizers' steps, the copy) is the mean of this many repeats, the
# kinds taken in turn repeat by repeat: on this 2-core VM one window's timings move 41% from one
# window to the next, and SGD and Adam timed in separate windows gave adam_work 6.2-9.9 over 16
# fresh calibrations, 5.0-6.3 over 20 timed in turn (datasets/measurements/calibration-repeat-2026-11-29b)
PER_BYTE_REPEATS = 8


def _gemm(a: torch.Tensor, b: torch.Tensor) -> None:
    for _ in range(GEMM_ITERS):
        torch.mm(a, b)


def _optimizer_step(kind: str = "sgd") -> Any:
    """One step over ``OPT_NUMEL`` parameters of the runtime's default optimizer (plain SGD), or of
    SGD with momentum (``"momentum"``: one state tensor) or Adam (``"adam"``: two)."""
    from distlab.runtime.trainer import default_optimizer

    p = torch.nn.Parameter(torch.zeros(OPT_NUMEL))
    p.grad = torch.ones(OPT_NUMEL)
    if kind == "momentum":
        return torch.optim.SGD([p], lr=0.01, momentum=0.9).step
    if kind == "adam":
        return torch.optim.Adam([p], lr=1e-3).step
    return default_optimizer([p]).step


def _copy_step() -> Any:
    """A bucket's flatten as the runtime does it: ``torch.cat`` of ``COPY_PARTS`` gradients."""
    parts = [torch.ones(COPY_NUMEL // COPY_PARTS) for _ in range(COPY_PARTS)]
    return lambda: torch.cat(parts)


def _time_in_turn(fns: dict[str, Any], repeats: int, before: Any = None) -> dict[str, list[float]]:
    """Per-repeat seconds of each of ``fns`` on this rank alone (the others wait at a barrier), taken
    in turn repeat by repeat (so every figure sees the same moments of the machine); ``before()``,
    untimed, ahead of each."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            out[k].append(time.perf_counter() - t0)
    return out


def time_reps(fn: Any, repeats: int, group: Any, warmup: int = 1, before: Any = None) -> list[float]:
    """Per-repeat seconds, each started right after a barrier so all ranks begin together
    (``before()``, untimed, ahead of the barrier)."""
    out = []
    for i in range(warmup + repeats):
        if before is not None:
            before()
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def rank_compute_rows(
    local: int, world: int, group: Any, hosts: list[Any], base: dict[str, Any], repeats: int
) -> list[dict[str, Any]]:
    """This rank's ``compute`` row (a GEMM alone, others waiting at a barrier, and with every rank
    busy at once), ``optimizer`` row (plain SGD's step alone and all busy), ``copy`` row and
    ``optimizer:<kind>`` rows, each figure the mean over the ranks (microbench_rank's docstring
    says what each holds)."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(GEMM_N, GEMM_N, generator=g)
    b = torch.randn(GEMM_N, GEMM_N, generator=g)
    evict = torch.ones(EVICT_NUMEL)
    step, copy = _optimizer_step(), _copy_step()
    kinds = {k: _optimizer_step(k) for k in OPTIMIZER_KINDS}

    def cold() -> None:  # the optimizer's and the copy's bytes out of cache, as in a training step
        evict.sum()

    _gemm(a, b)  # warm-up
    step()
    copy()
    for fn in kinds.values():
        fn()  # creates the state tensors
    alone = opt_alone = copy_alone = 0.0
    kind_alone = dict.fromkeys(kinds, 0.0)
    for turn in range(world):
        dist.barrier(group=group)
        if turn == local:
            alone = statistics.median(_time_in_turn({"gemm": lambda: _gemm(a, b)}, repeats)["gemm"])
            per_byte = _time_in_turn({"sgd": step, "copy": copy, **kinds}, PER_BYTE_REPEATS, cold)
            opt_alone, copy_alone = statistics.mean(per_byte["sgd"]), statistics.mean(per_byte["copy"])
            for k in kinds:
                kind_alone[k] = statistics.mean(per_byte[k])
        dist.barrier(group=group)
    busy = statistics.median(time_reps(lambda: _gemm(a, b), repeats, group, warmup=0))
    opt = statistics.median(time_reps(step, repeats, group, before=cold))
    t = torch.tensor([alone, busy, opt, opt_alone, copy_alone, *kind_alone.values()], dtype=torch.float64)
    dist.all_reduce(t, group=group)  # mean over ranks
    alone, busy, opt, opt_alone, copy_alone, *per_kind = (t / world).tolist()
    me = hosts[local]
    flops = 2.0 * GEMM_N**3 * GEMM_ITERS
    return [
        {
            **base,
            "collective": "compute",
            "nbytes": 0,
            "seconds": busy,
            "alone": alone,
            "contention": busy / alone if alone > 0 else float("nan"),
            "flops": flops,
            "ranks_on_host": max(hosts.count(h) for h in set(hosts)),
            "cores": available_cores(),
            "host": me,
        },
        {**base, "collective": "optimizer", "nbytes": OPT_NUMEL * 4, "seconds": opt, "alone": opt_alone},
        {**base, "collective": "copy", "nbytes": COPY_NUMEL * 4, "seconds": copy_alone, "alone": copy_alone},
        *(
            {**base, "collective": f"optimizer:{k}", "nbytes": OPT_NUMEL * 4, "seconds": s, "alone": s}
            for k, s in zip(kinds, per_kind)
        ),
    ]
