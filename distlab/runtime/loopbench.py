"""Rank-side measurements of whole training steps that calibration runs: ``overhead_rank`` runs the
real training loop on ``LoopCase``s (the training-loop stage), ``loop_pass_rank`` a pass of
``LocalCase``s' local steps (and of that stage) at one world size. How many passes and how long
each lasts is the caller's choice (``calibration/measure.py``); the defaults here are the reference
models'. The collectives' and compute microbenchmarks are in microbench.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from distlab.runtime.progress import tick

LOCAL_WARMUP, LOCAL_STEPS = 2, 8
LOCAL_MAX_STEPS = 60  # the cap on steps when a pass is given seconds to fill with short steps


class LoopCase(NamedTuple):
    """A training-loop case: ``model`` under ``strategy`` on ``data`` at per-replica ``batch``,
    ``steps`` steps a pass, ``passes`` passes."""

    model: Any
    strategy: Any
    data: Any
    batch: int
    steps: int
    passes: int


class LocalCase(NamedTuple):
    """A model whose local step is measured: ``model`` on ``data`` at per-replica ``batch``,
    trained on ``loss`` (None: the runtime's default loss)."""

    model: Any
    data: Any
    batch: int
    loss: Any = None


def overhead_rank(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    cases: Sequence[LoopCase | tuple[Any, ...]],
    timeout: float,
) -> list[list[float]]:
    """(worker) The real training loop (``run_rank``) on each ``LoopCase``, ``passes`` times: the
    cases in turn, pass after pass, so a case's passes lie apart in time and a slow moment of the
    machine hits one of them.

    Returns this rank's seconds per step per case (from one step's end to the next, as a run's
    throughput is timed), every step of every pass but each pass's first third (warm-up): what
    the cost model sees of hooks, bucket copies, per-tensor dispatch, data and Python beyond the
    arithmetic. Every rank returns as many steps per case, in the same order, so the caller can
    take each step's slowest rank and then the median over steps (``launch.metrics.slowest_median``),
    pooling the steps of several calls made at other moments.
    """
    loops = [LoopCase(*c) for c in cases]
    times: list[list[float]] = [[] for _ in loops]
    for p in range(max((c.passes for c in loops), default=0)):
        for i, case in enumerate(loops):
            if p < case.passes:
                times[i].extend(
                    _overhead_pass(rank, world, master_addr, master_port, case, f"{i}-{p}", timeout)
                )
                tick(f"training loop case {i + 1} of {len(loops)}")
    return times


def _overhead_pass(
    rank: int, world: int, master_addr: str, master_port: int, case: LoopCase, tag: str, timeout: float
) -> list[float]:
    """One pass of an overhead case: each step's seconds from the end of the step before to its
    own (what ``launch.metrics.throughput`` times of a run), the first third (warm-up) excluded."""
    from distlab.runtime.job import RankJob
    from distlab.runtime.trainer import run_rank

    job = RankJob(
        rank=rank,
        world=world,
        master_addr=master_addr,
        master_port=master_port,
        strategy=case.strategy,
        model=case.model,
        steps=case.steps,
        data=case.data,
        batch_size=case.batch,
        shuffle=True,  # as lab.launch runs by default
        run_id=f"distlab-overhead-{tag}",
        timeout=timeout,
    )
    ends = [r["wall_time"] for r in run_rank(job)["records"]]
    skip = max(1, len(ends) // 3)
    return [b - a for a, b in zip(ends[skip - 1 :], ends[skip:])]


def loop_pass_rank(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    local: Sequence[LocalCase | tuple[Any, ...]],
    threads: list[int],
    cases: Sequence[LoopCase | tuple[Any, ...]],
    timeout: float,
    seconds: float = 0.0,
    max_steps: int = LOCAL_MAX_STEPS,
    gpu: bool = False,
) -> tuple[list[list[float]], list[list[float]]]:
    """(worker) One pass at this world size: each ``LocalCase``'s own step with every rank busy,
    then the training loop on each ``LoopCase`` (``overhead_rank``).

    The local step is the training loop (``run_rank``) less the strategy: read the batch, zero
    the gradients, forward, loss, backward, read the loss; no optimizer step (the cost model has
    its own term). Every rank takes it at once, at the threads a run of this world size gives it
    (``threads[rank]``), and the ranks step in lockstep (after each step one 4-byte all-reduce
    agrees whether to go on), because a synchronous run's step waits for its slowest rank and
    free-running ranks never wait. ``LOCAL_STEPS`` steps each, more up to ``seconds`` in all (and
    at most ``max_steps``) when steps are short. One world size a call, as a run of that many
    ranks is; the local steps beside the loop, because calibration fits the loop's cost as its
    step less the local step of the same moment (evidence: docs/cost-model.md §History and
    evidence).

    ``gpu``: the ranks are a GPU Lab's, and the local step runs on the GPU this worker sees, as
    the run's would (``launch.train``); the loop cases carry their own strategy's devices.

    Returns (this rank's local-step seconds per ``local`` case, its seconds per step per case):
    every timed step, aligned by step across ranks, for the caller to pool over passes and take
    the median of each step's slowest rank, as a run's throughput does
    (``launch.metrics.slowest_median``).
    """
    from datetime import timedelta

    from distlab.allocator import tune_allocator
    from distlab.runtime.process_group import process_group

    tune_allocator()
    own: list[list[float]] = []
    if local:
        torch.set_num_threads(int(threads[rank]))
        store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timedelta(seconds=timeout))
        with process_group(
            dist.PrefixStore("distlab-local-step/", store), rank, world, "gloo", timeout, "cpu"
        ):
            lockstep = dist.group.WORLD if world > 1 else None
            for case in (LocalCase(*c) for c in local):
                case.model.train()
                dist.barrier()
                own.append(
                    _time_local(
                        case.model,
                        case.data,
                        case.batch,
                        rank,
                        world,
                        LOCAL_STEPS,
                        lockstep,
                        seconds,
                        max_steps,
                        case.loss,
                        "cuda:0" if gpu and torch.cuda.is_available() else "cpu",
                    )
                )
                tick(f"local step of {type(case.model).__name__}")
            dist.barrier()
    return own, overhead_rank(rank, world, master_addr, master_port, cases, timeout)


def _time_local(
    model: Any,
    data: Any,
    batch: int,
    rank: int,
    k: int,
    steps: int,
    lockstep: Any = None,
    seconds: float = 0.0,
    max_steps: int = LOCAL_MAX_STEPS,
    loss: Any = None,
    device: str = "cpu",
) -> list[float]:
    """Wall-clock seconds of each local step, at least ``steps`` of them (more, up to
    ``seconds`` in all and ``max_steps`` steps, when steps are short). ``lockstep``: the group
    of the ``k`` ranks, which agree after every step whether to go on, so a step lasts until
    the slowest rank has taken it, as in a synchronous run (a rank descheduled while ranks
    outnumber cores delays the step it falls in for all)."""
    from distlab.runtime.data import RankBatches
    from distlab.runtime.trainer import default_loss

    step = _local_step(model, RankBatches(data, batch, rank, k, False, 0), loss or default_loss, device)
    for i in range(LOCAL_WARMUP):
        step(i * batch * k)
    vote = torch.zeros(1)
    times: list[float] = []
    more, t0 = True, time.perf_counter()
    end = t0 + seconds
    while more:
        step((LOCAL_WARMUP + len(times)) * batch * k)
        n = len(times) + 1
        more = n < steps or (time.perf_counter() < end and n < max_steps)
        if lockstep is not None:  # go on while any rank wants to: every rank takes as many steps
            vote[0] = float(more)
            dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=lockstep)
            more = bool(vote.item() > 0)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    return times


def _local_step(model: Any, batches: Any, loss_fn: Any, device: str = "cpu") -> Any:
    """One step of ``model`` at data position ``pos`` on ``device``: the training loop less
    synchronisation and optimizer (reading the loss waits for a GPU's work)."""
    from distlab.runtime.data import call_model, to_device

    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]

    def step(pos: int) -> None:
        x, y = (to_device(t, device) for t in batches.get(pos))
        for p in params:
            p.grad = None
        loss = loss_fn(call_model(model, x), y)
        loss.backward()
        float(loss.detach())

    return step
