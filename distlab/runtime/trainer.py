"""run_rank: one rank's whole run — validate, rendezvous, then its training function (a user's own
``train(ctx)``, or distlab's loop as one: runtime/builtin_loop.py) through the one runtime of
runtime/own_session.py; and the pieces of that runtime a strategy decides (its synchroniser, stop
margin, records)."""

from __future__ import annotations

import dataclasses
import gc
import traceback
from collections.abc import Callable
from typing import Any

import torch

from distlab.allocator import heap_cache, tune_allocator
from distlab.errors import DistlabError, LaunchError

# default_loss, default_optimizer: distlab's loop's defaults, read from here by the profilers and benchmarks
from distlab.runtime.builtin_loop import BuiltinLoop, default_loss, default_optimizer  # noqa: F401
from distlab.runtime.ddp import DDPSynchronizer
from distlab.runtime.gossip import resolve_topology
from distlab.runtime.job import RankJob
from distlab.runtime.own_session import run_own
from distlab.runtime.plan import build_units
from distlab.runtime.process_group import (
    PeerFailed,
    abort_groups,
    connect_store,
    failure_of_other,
    process_group,
    report_failure,
    resolve_backend,
)
from distlab.runtime.sparse import sparse_names
from distlab.runtime.sync import Synchronizer
from distlab.runtime.trace import OFF
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
    own = job.train_fn is not None  # a user's loop (Lab.run); else distlab's, as a train(ctx) too
    if not own:
        if job.data is None:
            raise LaunchError("RankJob.data: None; pass a map-style Dataset of (input, target) pairs")
        if job.steps <= job.start_step:
            raise LaunchError(f"RankJob.steps: {job.steps} <= start_step {job.start_step}; nothing to train")
        job = dataclasses.replace(job, model=job.model.to(job.device))
        job = dataclasses.replace(job, train_fn=BuiltinLoop.of(job))
    build_units(job.model, job.strategy, job.world)  # StrategyError before any rendezvous
    backend = resolve_backend(job.strategy.backend, job.device)
    pstore = connect_store(job.master_addr, job.master_port, job.world, job.timeout, job.run_id, store)
    progress = {"step": job.start_step}
    # the run's freed memory is reused by its next step, not unmapped and faulted in again
    with heap_cache(), process_group(pstore, job.rank, job.world, backend, job.timeout, job.device) as waiter:
        try:
            out = run_own(job, pstore, emit, should_stop, progress, waiter.wait)
            if not own:
                del out["result"]  # the step count distlab's loop returns: the records say it
            return out
        except Exception as exc:  # noqa: BLE001 - every failure leaves through one DistlabError
            other = failure_of_other(pstore, job.rank, wait=2.0 if _is_comm_error(exc) else 0.0)
            cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            where = _user_line(exc, job.train_fn) if own else ""
            said = f"rank {job.rank} failed at step {progress['step']}{where}: {cause}"
            if other is None:  # before the abort: a woken peer reads it, and its PeerFailed names
                # this rank in the words of this rank's own error (step and line included), which
                # the driver shows when the peer's error reaches it first
                own_words = cause if isinstance(exc, DistlabError) else f"LaunchError: {said}"
                report_failure(pstore, job.rank, own_words)
            # the peers leave their collectives now (one blocked in DDP's reducer sees no store),
            # not when the garbage collector frees this group (0.5 s of gc.collect here)
            aborted = abort_groups()
            _release(exc, collect=not aborted)
            if other is not None and not isinstance(exc, DistlabError):
                raise PeerFailed(job.rank, other[0], other[1]) from exc
            if isinstance(exc, DistlabError):
                raise
            raise LaunchError(said) from exc


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
