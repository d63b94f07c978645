"""How long a model stage of a calibration will take, from one step of each case measured on a worker
first: said in a line before a long stage starts, and the pace its progress bar moves at."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distlab.runtime.loopbench import LOCAL_STEPS, LOCAL_WARMUP, LocalCase

if TYPE_CHECKING:
    from distlab.cluster.cluster import Cluster

# each call of the model stage costs about CALL_SECONDS besides its steps (its tasks, a process group)
CALL_SECONDS = 0.5
FIRST_STEPS, FIRST_SECONDS = 3, 3.0  # the steps taken for the estimate: at most 3, fewer past 3 s


def first_steps(cases: Sequence[Any], threads: int, gpu: bool = False) -> list[float]:
    """(worker) Seconds of a local step of each ``LocalCase`` as the model stage takes it (forward,
    loss, backward, the loss read) at ``threads`` torch threads: the fastest of its first
    ``FIRST_STEPS``, fewer once they took ``FIRST_SECONDS`` (a first step pays one-off costs, a
    small part of a step of seconds)."""
    import torch

    from distlab.runtime.data import RankBatches, call_model, to_device
    from distlab.runtime.trainer import default_loss

    device = "cuda:0" if gpu and torch.cuda.is_available() else "cpu"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # as a one-rank run's rank has (spmd.rank_entry)
    out = []
    try:
        for case in (LocalCase(*c) for c in cases):
            model = case.model.to(device)
            model.train()
            batch = RankBatches(case.data, case.batch, 0, 1, False, 0).get(0)
            x, y = (to_device(t, device) for t in batch)
            times: list[float] = []
            while not times or (len(times) < FIRST_STEPS and sum(times) < FIRST_SECONDS):
                t0 = time.perf_counter()
                loss = (case.loss or default_loss)(call_model(model, x), y)
                loss.backward()
                float(loss.detach())
                times.append(time.perf_counter() - t0)
                for p in model.parameters():
                    p.grad = None
            out.append(min(times))
    finally:
        torch.set_num_threads(before)
    return out


def time_first_steps(cluster: Cluster, cases: Sequence[LocalCase]) -> list[float]:
    """``first_steps`` on the first worker, one task (not a rank: no process group). The
    kernel's interrupt cancels it; the worker finishes the step it is in."""
    import dask.config

    res = cluster.resources
    workers = cluster.first(1, res)
    # the task carries the models, as every rank's does: no "large graph" warning
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": "64GiB"}):
        future = cluster.client.submit(
            first_steps,
            list(cases),
            cluster.threads_for(workers, res)[0],
            res.gpus,
            workers=workers,
            allow_other_workers=False,
            pure=False,
        )
    try:
        return list(future.result())
    except BaseException:
        cluster.client.cancel([future], force=True)
        raise


@dataclass(frozen=True)
class StageEstimate:
    """The model stage's expected seconds per call at each world size (``calls[k]``), over
    ``passes`` passes, from ``first``: each case's first step alone, on one rank."""

    first: tuple[float, ...]
    calls: dict[int, float]
    passes: int

    @property
    def seconds(self) -> float:
        return self.passes * sum(self.calls.values())


def estimate_stage(
    cluster: Cluster,
    cases: Sequence[LocalCase],
    worlds: Sequence[int],
    passes: int,
    seconds: float,
    max_steps: int,
) -> StageEstimate:
    """Time one step of each case on the first worker (one task), then price the stage's calls: at
    world size k a rank's step is the one-rank step times the cores one rank had over the cores
    each of k has (the threads a k-rank run gives it, fewer where ranks outnumber cores), and a
    call takes, per case, ``LOCAL_WARMUP`` steps and ``LOCAL_STEPS`` more (more up to ``seconds``,
    at most ``max_steps``) as ``loopbench.loop_pass_rank`` does."""
    res = cluster.resources
    first = time_first_steps(cluster, cases)
    host = res.ranks[0].host
    cores = max(1, res.cores.get(host) or 1)

    def per_rank_cores(k: int) -> float:
        on_host = sum(1 for r in res.ranks[:k] if r.host == host)
        return min(cluster.threads_for(cluster.first(k, res), res)[0], cores / on_host)

    alone = per_rank_cores(1)
    calls = {}
    for k in worlds:
        scale = alone / per_rank_cores(k)
        total = CALL_SECONDS
        for t in first:
            step = t * scale
            more = max(LOCAL_STEPS, min(max_steps, math.ceil(seconds / step) if step > 0 else max_steps))
            total += (LOCAL_WARMUP + more) * step
        calls[k] = total
    return StageEstimate(tuple(first), calls, passes)


def about(seconds: float) -> str:
    """``about 40 s``, ``about 1 minute``, ``about 14 minutes``: a duration as a person says it."""
    if seconds < 90:
        return f"about {max(10, round(seconds, -1)):.0f} s"
    minutes = round(seconds / 60)
    return f"about {minutes} minute{'s' if minutes != 1 else ''}"
