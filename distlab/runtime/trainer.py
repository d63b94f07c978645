"""run_rank: one rank's whole run — validate, rendezvous, train under the strategy, checkpoint, report."""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from distlab.allocator import heap_cache, tune_allocator
from distlab.errors import DistlabError, LaunchError
from distlab.runtime.adaptive import BatchState
from distlab.runtime.builtin_loop import default_loss, default_optimizer
from distlab.runtime.cut import EndRendezvous
from distlab.runtime.data import call_model, to_device
from distlab.runtime.ddp import DDPSynchronizer
from distlab.runtime.gossip import resolve_topology
from distlab.runtime.job import STEP_RECORD_KEYS, RankJob
from distlab.runtime.plan import build_units
from distlab.runtime.process_group import (
    PeerFailed,
    StopSignal,
    abort_groups,
    connect_store,
    failure_of_other,
    process_group,
    report_failure,
    resolve_backend,
)
from distlab.runtime.resume import Checkpoints, resume
from distlab.runtime.sparse import sparse_names
from distlab.runtime.straggler import Straggler
from distlab.runtime.sync import Synchronizer
from distlab.runtime.trace import OFF, Tracer, align
from distlab.strategy.execution import ddp_applies


def loss_name(loss: object, target: torch.Tensor | None = None) -> str:
    """What a run minimises, in words: the user's callable by name, or the default for its targets."""
    if loss is not None:
        return getattr(loss, "__name__", None) or type(loss).__name__
    if target is not None and target.is_floating_point():
        return "mean-squared error (the default for float targets)"
    return "cross-entropy (the default for integer targets)"


def run_rank(
    job: RankJob,
    emit: Callable[[dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    store: Any = None,
) -> dict[str, Any]:
    """Train ``job.steps - job.start_step`` steps of ``job.model`` under ``job.strategy`` as rank
    ``job.rank``.

    Returns ``{"rank", "steps", "records", "state_dict", "checkpoint", "consensus_distance",
    "stopped"}``; ``state_dict`` is rank 0's trained weights (CPU), ``None`` elsewhere.
    The strategy is validated before the rendezvous, so a mismatch fails every rank at once.
    A failing rank records its cause in the store and tears its group down; the others then
    raise ``LaunchError`` naming it instead of waiting for the collective timeout.
    """
    tune_allocator()
    if job.threads:
        torch.set_num_threads(job.threads)
    torch.manual_seed(job.seed + job.rank)
    own = job.train_fn is not None  # a user's loop (Lab.run): it prepares its own model and data
    if job.data is None and not own:
        raise LaunchError("RankJob.data: None; pass a map-style Dataset of (input, target) pairs")
    if not own and job.steps <= job.start_step:
        raise LaunchError(f"RankJob.steps: {job.steps} <= start_step {job.start_step}; nothing to train")
    model = job.model.to(job.device) if not own else job.model
    units = build_units(model, job.strategy, job.world)  # StrategyError before any rendezvous
    backend = resolve_backend(job.strategy.backend, job.device)
    pstore = connect_store(job.master_addr, job.master_port, job.world, job.timeout, job.run_id, store)
    progress = {"step": job.start_step}
    # the run's freed memory is reused by its next step, not unmapped and faulted in again
    with heap_cache(), process_group(pstore, job.rank, job.world, backend, job.timeout, job.device) as waiter:
        try:
            if own:
                from distlab.runtime.own_session import run_own

                return run_own(job, pstore, emit, should_stop, progress, waiter.wait)
            return _train(job, model, units, pstore, emit, should_stop, progress, waiter.wait)
        except Exception as exc:  # noqa: BLE001 - every failure leaves through one DistlabError
            other = failure_of_other(pstore, job.rank, wait=2.0 if _is_comm_error(exc) else 0.0)
            cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if other is None:
                report_failure(pstore, job.rank, cause)  # before the abort: a woken peer reads it
            # the peers leave their collectives now (one blocked in DDP's reducer sees no store),
            # not when the garbage collector frees this group (0.5 s of gc.collect here)
            aborted = abort_groups()
            _release(exc, collect=not aborted)
            if other is not None and not isinstance(exc, DistlabError):
                raise PeerFailed(job.rank, other[0], other[1]) from exc
            if isinstance(exc, DistlabError):
                raise
            where = _user_line(exc, job.train_fn) if own else ""
            raise LaunchError(f"rank {job.rank} failed at step {progress['step']}{where}: {cause}") from exc


def _user_line(exc: BaseException, fn: Any) -> str:
    """Where in the user's own loop ``exc`` was raised: ``", in train line 12 (loss = ...)"``, the
    deepest frame of ``fn``'s file; "" when none is."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == code.co_filename]
    if not frames:
        return ""
    f = frames[-1]
    text = (f.line or "").strip()
    return f", in {f.name} line {f.lineno}" + (f" ({text[:80]})" if text else "")


def _release(exc: BaseException, collect: bool = True) -> None:
    """Drop the failed run's objects (DDP reducer, kernels) that the traceback keeps alive.

    The launcher keeps the exception (and so its frames). Without an abort the group's sockets
    close only when nothing refers to it, so ``collect`` frees it at once, or the peers would
    wait for their timeout; after an abort the collector frees the rest in its own time.
    """
    traceback.clear_frames(exc.__traceback__)
    if collect:
        gc.collect()


def _is_comm_error(exc: BaseException) -> bool:
    """A failure of a collective (a peer went away or timed out), as opposed to this rank's own bug."""
    if isinstance(exc, getattr(torch.distributed, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        k in text for k in ("gloo", "Connection", "Timed out", "NCCL", "timeout")
    )


def measures_noise(job: RankJob) -> bool:
    """The run measures its gradient noise scale: AdaScale and the goodput controller need it,
    ``options.noise_scale`` asks for it."""
    return (
        job.strategy.batch.lr_scaling == "adascale"
        or job.options.noise_scale
        or job.options.adaptive is not None
    )


def goodput_controller(job: RankJob) -> Any:
    """The goodput controller of an adaptive run: ``options.adaptive`` holds the predicted
    seconds per step of every allowed (per-replica batch, accumulation), as ``[[b, k, s], ...]``."""
    spec = job.options.adaptive
    if spec is None:
        return None
    from distlab.adaptive.controller import GoodputController

    table = {(int(b), int(k)): float(s) for b, k, s in spec["table"]}
    base = int(job.options.base_batch or job.batch_size or job.strategy.batch.per_replica)
    return GoodputController(table, job.world, base)


def make_sync(
    job: RankJob, model: torch.nn.Module, units: list, make_opt: Callable, wait: Callable, tracer: Any = OFF
) -> Any:
    s = job.strategy
    ef = bool(s.options.get("error_feedback", False))
    noise = None
    if measures_noise(job):
        from distlab.runtime.noise import GradNoise

        batch = job.batch_size or s.batch.per_replica
        noise = GradNoise(units, make_opt, job.rank, job.world, batch, s.batch.accumulation, wait)
    # DDP's reducer averages local gradients out of reach of the noise measurement's hooks
    ddp = noise is None and job.options.ddp and job.world > 1
    if ddp and ddp_applies(s, sparse_names(model, units), ef):
        return DDPSynchronizer(model, units, make_opt, job.device, tracer)
    gossiping = any(u.sync.kind == "gossip" for u in units)
    topo = resolve_topology(s, job.topology) if gossiping else None
    return Synchronizer(
        model,
        units,
        make_opt,
        job.rank,
        job.world,
        topology=topo,
        gossip_mode=s.gossip.mode if s.gossip else "atc",
        error_feedback=ef,
        bucket_bytes=job.options.bucket_bytes,
        wait=wait,
        packed=job.options.sparse_exchange == "packed",
        noise=noise,
        tracer=tracer,
        timeout=job.timeout,
    )


def stop_margin(sync: Any, world: int) -> int:
    """Steps between a stop request and the agreed stop: collectives keep ranks within one step of
    each other, gossip ranks within the graph's diameter, a stale PS's within its staleness (an
    asynchronous one is unbounded: a rank already past the agreed step stops where it is)."""
    if sync.stale is not None:
        return (sync.stale.gate or 0) + 2
    if getattr(sync.gossip, "asynchronous", False):
        return 2
    return world + 1 if sync.gossip is not None else 2


def is_asynchronous(sync: Any) -> bool:
    """Whether the run's ranks go at their own pace with no bound on their drift: an asynchronous
    PS, asynchronous gossip. Their checkpoints are cuts on request and a stop is where each rank
    stands (runtime/cut.py). A stale-synchronous PS is not: its gate keeps the fastest rank within
    s steps of the slowest, so a checkpoint at a common step costs the fast ranks at most s of the
    slowest rank's steps, and it keeps the resume exact (every push of the steps before it
    applied, none after)."""
    if sync.stale is not None:
        return sync.stale.gate is None
    return bool(getattr(sync.gossip, "asynchronous", False))


def consistency_record(sync: Any) -> dict[str, int]:
    """A stale PS step's record: this rank's clock and the staleness of the values it read; an
    asynchronous gossip step's: its clock and its disagreement with the neighbours it heard."""
    if getattr(sync.gossip, "asynchronous", False):
        return sync.gossip.record()
    return {} if sync.stale is None else {"clock": sync.stale.clock, "staleness": sync.stale.seen}


def _forward_backward(
    job: RankJob, forward: Any, loss_fn: Any, sync: Any, batches: Any, pos: int, tracer: Any, slow: Any
) -> tuple[float, dict[str, float]]:
    """One step's forward and backward over its micro-batches, gradients accumulating (the last
    micro-batch syncs them); returns the step's mean loss and its metrics' means
    (``job.options.metrics``: distlab.step_metrics, on each micro-batch before the update).
    ``slow``: a ``Straggler`` that waits before each backward when this rank is slowed."""
    loss_value = 0.0
    accum = batches.accum
    metrics = job.options.metrics
    values = dict.fromkeys((m.name for m in metrics), 0.0)
    for micro in range(accum):
        x, y = batches.data.get(pos, micro)
        x, y = to_device(x, job.device), to_device(y, job.device)
        with sync.micro(micro == accum - 1):
            with tracer.span("forward", "forward", micro=micro):
                t0 = time.perf_counter()
                out = call_model(forward, x)
                loss = loss_fn(out, y)
            slow.wait(time.perf_counter() - t0, tracer)
            with tracer.span("backward", "backward", micro=micro):
                t0 = time.perf_counter()
                (loss / accum if accum > 1 else loss).backward()
                slow.backward_took(time.perf_counter() - t0)
        loss_value += float(loss.detach()) / accum
        for m in metrics:
            values[m.name] += m(out, y) / accum
    return loss_value, values


def _train(
    job: RankJob,
    model: torch.nn.Module,
    units: list,
    store: Any,
    emit: Any,
    should_stop: Any,
    progress: dict[str, int],
    wait: Callable,
) -> dict[str, Any]:
    # Long because one step's order (a stop, forward and backward, the strategy's step, the
    # record, a checkpoint) and the run's end (the rendezvous, the last collectives) read best as
    # one loop: each piece is a call, the order between them is the design.
    make_opt = job.optimizer or default_optimizer
    loss_fn = job.loss or default_loss
    tracer: Any = OFF
    slow = Straggler.for_job(job)
    if job.options.trace:
        tracer = Tracer()
        align(tracer, job.rank, job.world, job.device)
    sync = make_sync(job, model, units, make_opt, wait, tracer)
    forward = getattr(sync, "wrapped", model)
    noise = getattr(sync, "noise", None)
    batches = BatchState(job, noise, [sync.local_opt, sync.server_opt], wait, goodput_controller(job))
    pos = job.sample_offset
    if job.resume_from:
        resume(job, model, sync, units, batches)
    asynchronous = is_asynchronous(sync)
    stop = StopSignal(store, should_stop, margin=stop_margin(sync, job.world), at_once=asynchronous)
    ckpts = Checkpoints(job, model, sync, units, batches, store, asynchronous)
    end = EndRendezvous(
        store, job.rank, job.world, job.timeout, lambda: failure_of_other(store, job.rank, wait=0.0)
    )
    records: list[dict[str, Any]] = []
    step = job.start_step
    stopped = False
    try:
        model.train()
        for step in range(job.start_step, job.steps):
            if stop.stop_before(step):
                stopped = True
                ckpts.at_stop(step, pos)
                break
            progress["step"] = step
            t0 = time.perf_counter()
            sync.zero_grad()
            sync.begin(step)
            loss_value, metric_values = _forward_backward(
                job, forward, loss_fn, sync, batches, pos, tracer, slow
            )
            t_bwd = time.perf_counter()
            gains = batches.gains()
            with batches.scaled(gains):
                sync.step(step)
            exposed = max(0.0, t_bwd - sync.last_ready) if sync.last_ready else 0.0
            t1 = time.perf_counter()
            pos_before, pos = pos, pos + batches.global_batch
            values = (job.run_id, step, job.rank, loss_value, pos, t1 - t0, exposed + sync.comm_time)
            rec: dict[str, Any] = dict(zip(STEP_RECORD_KEYS, (*values, time.time())))
            rec.update(batches.after_step(pos_before, pos, t1 - t0, gains), **metric_values, **slow.record())
            rec.update(consistency_record(sync))
            if tracer.enabled:
                rec["trace"] = tracer.take()
            records.append(rec)
            if emit is not None:
                emit(rec)
            ckpts.after_step(step + 1, pos)
            if asynchronous:
                end.progress(step + 1)
        if not stopped:
            ckpts.at_end(pos)
        if asynchronous:
            sync.finish(end.wait)  # the ranks meet through the store: no collective waits for a straggler
        else:
            sync.finish()
        distance = sync.gossip.consensus_distance() if sync.gossip is not None else None
        last_ckpt = ckpts.wait()  # the last checkpoint reported is on disk
    finally:
        ckpts.close()
        sync.close()
    return {
        "rank": job.rank,
        "steps": len(records),
        "records": records,
        "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        if job.rank == 0
        else None,
        "checkpoint": last_ckpt,
        "consensus_distance": distance,
        "stopped": stopped,
    }
