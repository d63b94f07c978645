"""The SPMD core: run one function once per rank on Dask workers, with a TCPStore rendezvous.

Design (DESIGN.md, Launch): one Dask task per rank, pinned with ``workers=[w]``,
``allow_other_workers=False``, ``pure=False`` and no retries (a retried rank would join a
process group that no longer exists). The rendezvous store is a ``TCPStore`` server on an
OS-chosen port, opened by a tiny task in rank 0's worker *before* the ranks start, and held in
that worker process's registry (``_STORES``) keyed by run id. Keeping the server out of the rank
itself means it can be closed from outside: closing it makes every rank still waiting in the
rendezvous fail at once, which is how a cancel or a missing rank ends quickly.

A stop is asked first (``request_stop``: a run's ranks agree on a step and return); ranks still
executing after a grace, or any rank of a call whose function never reads the stop (a calibration's
measurements), are aborted: ``RankAborted`` is raised in the rank's own thread, which leaves its
process group, and the peers' collectives then fail at once. A worker is restarted only when a rank
survives that too (blocked in C code whose peers are all blocked as well).

The registries below live in *worker* processes (never in the notebook), keyed by run id, and
are emptied by ``cleanup`` when a run segment ends. They are the only worker-side state.

Long because the worker side (registries, stop, abort) and the client side (``RankGroup``: start,
wait, settle, escalate) are one protocol whose two halves must change together.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask

from distlab.cluster.interrupts import interrupts_held
from distlab.errors import LaunchError
from distlab.resources import host_of

# -- worker-process registries (keyed by run id) ----------------------------------------------
_STORES: dict[str, Any] = {}  # run id -> TCPStore server object
_STOPS: set[str] = set()  # run ids asked to stop
_ACTIVE: dict[str, set[int]] = {}  # run id -> ranks training in this process right now
_THREADS: dict[tuple[str, int], int] = {}  # (run id, rank) -> the thread executing it here
_ABORTED: set[tuple[str, int]] = set()  # ranks sent RankAborted (once each)
_LOCK = threading.Lock()
STOP_GRACE = 5.0  # seconds ranks get to stop on their own before they are aborted
ABORT_GRACE = 3.0  # seconds aborted ranks get to leave before their workers are restarted
LIVENESS_EVERY = 0.5  # seconds between a waiting run's looks for workers that left the cluster
INTERRUPT_GRACE = 1.0  # seconds ranks get to stop on their own after the kernel's interrupt
# seconds a worker gets to answer the client's stop, abort and "still running?" calls: a rank in C
# code that holds the GIL (a regular expression's backtracking, an extension without a GIL release)
# stops the worker's event loop, and an unbounded call made the failed run wait for that code
UNANSWERED = 5.0
CANCEL_ABORT_AFTER = 1.0  # seconds a cancelled run's ranks get to stop at a step before the abort


def open_store(run_id: str, host: str, timeout: float) -> int:
    """(worker) Open the rendezvous TCPStore server on an OS-chosen port; return the port."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    with _LOCK:
        _STORES[run_id] = store
        _STOPS.discard(run_id)
    return int(store.port)


def request_stop(run_id: str) -> bool:
    """(worker) Ask every rank of ``run_id`` in this process to stop after its current step."""
    with _LOCK:
        _STOPS.add(run_id)
    return True


def should_stop(run_id: str) -> bool:
    """(worker) True once the run was asked to stop (a set lookup: cheap enough for every step)."""
    return run_id in _STOPS


def cleanup(run_id: str, close_store: bool = True) -> bool:
    """(worker) Forget the run; closing its store fails every rank still in the rendezvous."""
    with _LOCK:
        store = _STORES.pop(run_id, None) if close_store else None
    del store  # the server thread stops when the last reference goes
    return True


def forget_stop(run_id: str) -> bool:
    with _LOCK:
        _STOPS.discard(run_id)
    return True


class RankAborted(BaseException):
    """Raised in a rank's thread by ``abort_ranks``: a BaseException, so the rank's own ``except
    Exception`` handlers do not swallow it on the way out of its process group."""


def abort_ranks(run_id: str) -> list[int]:
    """(worker) Raise ``RankAborted`` in the thread of each rank of ``run_id`` executing in this
    process (once per rank), and close the run's store if it is here (ranks in the rendezvous
    fail); returns the ranks aborted. Python delivers it at the thread's next bytecode: a rank
    computing leaves within an operator, one blocked in a collective when a peer's leaving
    closes its sockets."""
    cleanup(run_id)
    with _LOCK:
        sent = []
        for (rid, rank), ident in _THREADS.items():
            if rid == run_id and (rid, rank) not in _ABORTED:
                _ABORTED.add((rid, rank))
                _set_async_exc(ident, RankAborted)
                sent.append(rank)
    return sent


def _leave(run_id: str, rank: int) -> None:
    """(worker) The rank's thread is no longer its: it can no longer be aborted, and a
    ``RankAborted`` sent but not yet raised is withdrawn (the thread goes back to Dask)."""
    ident = threading.get_ident()
    with _LOCK:
        _THREADS.pop((run_id, rank), None)
        sent = (run_id, rank) in _ABORTED
        _ABORTED.discard((run_id, rank))
    if sent:
        _set_async_exc(ident, None)


def _set_async_exc(ident: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``ident`` at its next bytecode (None: withdraw one not yet raised)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc) if exc else None)


def active_ranks() -> dict[str, list[int]]:
    """(worker) Ranks still executing in this worker process, per run id."""
    with _LOCK:
        return {k: sorted(v) for k, v in _ACTIVE.items() if v}


def progress_topic(run_id: str) -> str:
    """The Dask event topic rank 0's ``progress.tick`` calls of one call go to."""
    return f"distlab-progress-{run_id}"


def rank_entry(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    run_id: str,
    threads: int,
    args: tuple[Any, ...],
) -> Any:
    """(worker) The Dask task of one rank: set torch threads, mark the rank active, call ``fn``."""
    import torch

    # Dask starts workers with OMP_NUM_THREADS=1; a rank owns its share of the host's cores.
    torch.set_num_threads(threads)
    from distlab.runtime import progress
    from distlab.runtime.process_group import bind_interface

    bind_interface()  # gloo on the address peers on other hosts reach this worker at
    progress.set_topic(progress_topic(run_id) if rank == 0 else None)
    with _LOCK:
        _ACTIVE.setdefault(run_id, set()).add(rank)
        _THREADS[(run_id, rank)] = threading.get_ident()
    failure = None
    try:
        try:
            return fn(rank, world, master_addr, master_port, *args)
        finally:
            # at most one RankAborted is ever sent to this rank: if it lands in _leave, the
            # second call completes it
            try:
                _leave(run_id, rank)
            except RankAborted:
                _leave(run_id, rank)
    except BaseException as exc:  # summarise here: the client sees one picklable error per rank
        failure = RankFailure(rank, os.uname().nodename, type(exc).__name__, str(exc), traceback.format_exc())
        failure.peer = (exc.peer, exc.cause) if hasattr(exc, "peer") else None
    finally:
        if failure is not None:
            # The exception's frames hold the rank's process group (through DDP, optimizers...):
            # free them now, so its sockets close and the peers' collectives fail at once instead
            # of waiting for their timeout. Raising outside the except block keeps no __context__.
            gc.collect()
        progress.set_topic(None)
        _leave(run_id, rank)  # when RankAborted landed before the inner finally could
        with _LOCK:
            ranks = _ACTIVE.get(run_id)
            if ranks is not None:
                ranks.discard(rank)
                if not ranks:
                    _ACTIVE.pop(run_id, None)
    raise failure


def first_cause(failures: Sequence[RankFailure]) -> RankFailure:
    """The failure a run reports: the first rank that raised on its own, else the rank that the
    peers' ``PeerFailed`` name (its own error may be one scheduler message behind theirs), as it
    named itself; else the first."""
    own = next((x for x in failures if x.kind != "PeerFailed"), None)
    if own is not None:
        return own
    peer = next((x.peer for x in failures if x.peer is not None), None)
    if peer is None:
        return failures[0]
    kind, _, message = peer[1].partition(": ")
    return RankFailure(peer[0], "?", kind, message)


class RankFailure(Exception):
    """A rank's exception, carried back to the client with its rank and traceback."""

    peer: tuple[int, str] | None = None  # (rank, "Kind: message") of the peer a PeerFailed names
    from_dask = False  # Dask's error for the task (a killed worker...), not one the rank raised

    def __init__(self, rank: int, host: str, kind: str, message: str, tb: str = "") -> None:
        super().__init__(rank, host, kind, message, tb)
        self.rank, self.host, self.kind, self.message, self.tb = rank, host, kind, message, tb

    @property
    def own_error(self) -> bool:
        """The rank raised by itself (its own code or data), not because a collective or a peer
        failed: no worker was lost, so the driver need not wait to see one leave."""
        if (
            self.from_dask
            or self.kind in ("PeerFailed", RankAborted.__name__)
            or self.kind.startswith("Dist")
        ):
            return False
        text = self.message
        return not any(k in text for k in ("gloo", "Connection", "Timed out", "NCCL", "timeout", "timed out"))

    def summary(self) -> str:
        if self.kind == RankAborted.__name__:
            return f"rank {self.rank} was aborted: it did not stop when asked"
        first = (self.message.strip().splitlines() or [""])[0]
        if len(first) > 240:
            first = first[:237] + "..."
        return f"rank {self.rank} raised {self.kind}: {first}"

    def __str__(self) -> str:
        return self.summary()


def workers_info(client: Any) -> dict[str, dict[str, Any]]:
    """The scheduler's workers, asked directly. (``client.scheduler_info()`` returns a cache that the
    client's periodic refresh overwrites with an empty worker list, from another thread: a race
    that would make every worker look lost.)"""
    if client.asynchronous:
        raise LaunchError("Lab needs a synchronous dask Client (asynchronous=False)")
    return dict(client.sync(client.scheduler.identity, n_workers=-1)["workers"])


@dataclass
class RankGroup:
    """The Dask futures of one launch of ``world`` ranks (a run segment)."""

    client: Any
    run_id: str
    workers: tuple[str, ...]
    master_addr: str
    master_port: int
    futures: list[Any] = field(default_factory=list)
    stop_requested_at: float | None = None
    abort_after: float | None = None  # seconds from the stop to the abort (None: STOP_GRACE)
    aborted_at: float | None = None
    restarted: set[str] = field(default_factory=set)

    def stop(self, abort_after: float | None = None) -> list[str]:
        """Ask every rank to stop; they agree on a step through the store and return normally.
        Ranks still executing ``abort_after`` seconds later (default ``STOP_GRACE``) are aborted:
        a cancel passes a short one, a pause (which needs the agreed step's checkpoint) none.
        Returns the workers that did not answer within ``UNANSWERED`` (their event loop blocked)."""
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
        if abort_after is not None:
            self.abort_after = abort_after if self.abort_after is None else min(self.abort_after, abort_after)
        return _broadcast(self.client, request_stop, self.run_id, self.workers)

    def abort(self) -> None:
        """Raise ``RankAborted`` in every rank of the run still executing (``abort_ranks``)."""
        if self.aborted_at is None:
            self.aborted_at = time.monotonic()
        _broadcast(self.client, abort_ranks, self.run_id, self.workers)

    def interrupt(self) -> None:
        """The kernel's interrupt while the client waits: ``settle`` with ``INTERRUPT_GRACE``
        seconds for the ranks to stop on their own before they are aborted; a worker is restarted
        when it did not answer the stop, or when one of its ranks outlives ``ABORT_GRACE`` more."""
        self.settle(INTERRUPT_GRACE)

    def _settled_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if not self.stuck():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    def close(self) -> None:
        """Close the rendezvous store, forget the run on its workers, release its tasks (always called)."""
        _broadcast(self.client, cleanup, self.run_id, self.workers[:1])
        _broadcast(self.client, forget_stop, self.run_id, self.workers)
        self.client.cancel(self.futures, force=True)

    def alive(self) -> set[str]:
        return set(workers_info(self.client))

    def stuck(self) -> list[str]:
        """Workers still executing a rank of this run."""
        alive = [w for w in self.workers if w in self.alive()]
        if not alive:
            return []
        out = run_on(self.client, active_ranks, (), alive)
        # a worker that does not answer is stuck as far as this run can tell: its event loop is
        # blocked, by this run's rank or by something else in its process
        return [
            w for w, v in out.items() if v is UNANSWERED_MARK or (isinstance(v, dict) and v.get(self.run_id))
        ]

    def restart_stuck(self, stuck: Sequence[str] | None = None) -> None:
        """Last resort: restart the worker processes whose rank outlived its abort (e.g. blocked
        in C code whose peers are all blocked too), or ``stuck`` ones. The Lab stays usable; those
        workers come back cold."""
        stuck = self.stuck() if stuck is None else list(stuck)
        if stuck:
            self.restarted.update(stuck)
            try:
                self.client.restart_workers(stuck, timeout=60, raise_for_error=False)
            except Exception:  # noqa: BLE001 - the nanny may already be replacing it
                pass

    def settle(self, timeout: float) -> None:
        """After a failure (or the kernel's interrupt: ``interrupt``): stop the other ranks, wait
        ``timeout`` s, abort any still executing, and restart the workers of those that outlive
        ``ABORT_GRACE`` more. A worker that did not answer the stop is restarted at once: nothing
        reaches a rank whose worker's event loop is blocked (C code holding the GIL), neither the
        stop nor the abort."""
        silent = self.stop()
        if silent:
            self.restart_stuck(silent)
        if self._settled_within(timeout):  # ranks that never started are not waited for
            return
        self.abort()
        if not self._settled_within(ABORT_GRACE):
            self.restart_stuck()

    def wait(self, timeout: float | None, poll: float = 0.1) -> list[Any]:
        """Results in rank order; the first failure (or lost worker) raises, after the others settled.

        After ``stop()``, ranks get ``abort_after`` (default ``STOP_GRACE``) seconds to agree on
        a step and return, then are aborted; the workers of ranks still executing ``ABORT_GRACE``
        later are restarted. The kernel's interrupt here (a ``KeyboardInterrupt`` in the waiting
        thread) ends the ranks (``interrupt``) before it propagates.
        """
        try:
            return self._wait(timeout, poll)
        except KeyboardInterrupt:
            with interrupts_held(reraise=False):  # a second press must not leave ranks running
                self.interrupt()
            raise

    def _wait(self, timeout: float | None, poll: float) -> list[Any]:
        # Woken by the futures themselves (a done callback), not by asking Dask every ``poll``
        # seconds: a rank's error is seen at once, and the waiting costs the ranks' cores nothing.
        # (Polling with ``distributed.wait`` every 0.1 s and asking the scheduler for its workers
        # each time cost the notebook's process 2.6 ms of CPU a poll, 2.6% of a core the ranks
        # share on a small machine.) Lost workers are looked for every ``LIVENESS_EVERY`` seconds.
        deadline = None if timeout is None else time.monotonic() + timeout
        woke = threading.Event()
        for f in self.futures:
            f.add_done_callback(lambda _f: woke.set())
        pending = list(self.futures)
        checked = time.monotonic()
        while True:
            woke.clear()
            done = [f for f in pending if f.done()]
            for f in done:
                if f.status == "error":
                    self.settle(STOP_GRACE)
                    raise self._first_cause(f)
                if f.status == "cancelled":
                    self.settle(STOP_GRACE)
                    raise LaunchError(f"run {self.run_id}: a rank's task was cancelled by the scheduler")
            pending = [f for f in pending if f not in done]
            if not pending:
                return [f.result() for f in self.futures]
            if time.monotonic() - checked >= LIVENESS_EVERY:
                checked = time.monotonic()
                lost = [w for w in self.workers if w not in self.alive()]
                if lost:
                    fresh = [w for w in lost if w not in self.restarted]
                    self.settle(STOP_GRACE)
                    raise WorkerLost(fresh or lost)
            self._escalate()
            if deadline is not None and time.monotonic() > deadline:
                self.settle(STOP_GRACE)
                raise LaunchError(
                    f"run {self.run_id}: ranks did not finish within {timeout:g} s; raise timeout="
                )
            woke.wait(poll)

    def _first_cause(self, seen: Any) -> RankFailure:
        """The failure to report once the ranks settled: the rank that raised first, not a peer
        that stopped because of it (``PeerFailed``), whichever of their errors arrived first."""
        errors = [seen] + [f for f in self.futures if f is not seen and f.status == "error"]
        failures = []
        for f in errors:
            exc = f.exception()
            if not isinstance(exc, RankFailure):
                exc = RankFailure(self.futures.index(f), "?", type(exc).__name__, str(exc))
                exc.from_dask = True
            failures.append(exc)
        return first_cause(failures)

    def _escalate(self) -> None:
        """A stop not obeyed in time: abort the ranks, then restart the workers of any left."""
        if self.stop_requested_at is None:
            return
        now = time.monotonic()
        grace = STOP_GRACE if self.abort_after is None else self.abort_after
        if self.aborted_at is None and now - self.stop_requested_at > grace:
            self.abort()
        elif self.aborted_at is not None and now - self.aborted_at > ABORT_GRACE:
            self.restart_stuck()


class WorkerLost(Exception):
    """Workers of a run left the cluster while it ran."""

    def __init__(self, workers: Sequence[str]) -> None:
        super().__init__(f"worker(s) {', '.join(workers)} left the cluster")
        self.workers = list(workers)


def _broadcast(client: Any, fn: Callable[..., Any], run_id: str, workers: Sequence[str]) -> list[str]:
    """``fn(run_id)`` on the live ones of ``workers``; the workers that did not answer in time."""
    info = workers_info(client)
    alive = [w for w in workers if w in info]
    out = run_on(client, fn, (run_id,), alive) if alive else {}
    return [w for w, v in out.items() if v is UNANSWERED_MARK]


UNANSWERED_MARK = object()  # run_on's value for a worker that did not answer within UNANSWERED


def run_on(
    client: Any, fn: Callable[..., Any], args: tuple[Any, ...], workers: Sequence[str]
) -> dict[str, Any]:
    """``client.run(fn, *args)`` on each of ``workers`` at once, each answer awaited ``UNANSWERED``
    seconds at most (Dask's ``callback_timeout``): ``{worker: its result}``, ``UNANSWERED_MARK`` for
    a worker that did not answer in time and None for one that failed or left (a worker leaving
    mid-call must not hide a run's own outcome)."""
    import asyncio

    async def one(w: str) -> tuple[str, Any]:
        try:
            out = await client.run(
                fn, *args, workers=[w], on_error="return", asynchronous=True, callback_timeout=UNANSWERED
            )
        except asyncio.TimeoutError:
            return w, UNANSWERED_MARK
        except Exception:  # noqa: BLE001 - a worker that left answers nothing
            return w, None
        value = out.get(w) if isinstance(out, dict) else None
        return w, None if isinstance(value, BaseException) else value

    async def every() -> dict[str, Any]:
        return dict(await asyncio.gather(*(one(w) for w in workers)))

    try:
        return client.sync(every)
    except Exception:  # noqa: BLE001 - the client closing mid-call: nothing answered
        return dict.fromkeys(workers)


def start_ranks(
    client: Any,
    workers: Sequence[str],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    run_id: str,
    threads: Sequence[int],
    timeout: float,
    key_prefix: str = "distlab-rank",
) -> RankGroup:
    """Open the store in rank 0's worker, then submit one pinned task per rank (rank i -> workers[i])."""
    if not workers:
        raise LaunchError("run: no workers to launch on; the cluster has none (check lab.client)")
    host = host_of(workers[0])
    opened = client.submit(
        open_store,
        run_id,
        host,
        timeout,
        workers=[workers[0]],
        allow_other_workers=False,
        pure=False,
        key=f"distlab-store-{run_id}",
    )
    try:
        port = opened.result(timeout=timeout)
    except KeyboardInterrupt:  # the store may open after all: closed here, as a group's close does
        with interrupts_held(reraise=False):
            client.cancel([opened], force=True)
            _broadcast(client, cleanup, run_id, workers[:1])
        raise
    group = RankGroup(client, run_id, tuple(workers), host, port)
    world = len(workers)
    try:
        for rank, w in enumerate(workers):
            # each rank's task carries the model by design (one copy per rank): no "large graph" warning
            with dask.config.set({"distributed.admin.large-graph-warning-threshold": "64GiB"}):
                future = client.submit(
                    rank_entry,
                    fn,
                    rank,
                    world,
                    host,
                    port,
                    run_id,
                    threads[rank],
                    args,
                    workers=[w],
                    allow_other_workers=False,
                    pure=False,
                    retries=0,
                    key=f"{key_prefix}-{run_id}-{rank}",
                )
            group.futures.append(future)
    except KeyboardInterrupt:  # ranks already submitted would wait in the rendezvous for the timeout
        with interrupts_held(reraise=False):
            group.interrupt()
            group.close()
        raise
    return group


def active_on_cluster(client: Any) -> dict[str, dict[str, list[int]]]:
    """Per worker, the ranks still executing there (empty when nothing trains)."""
    out = client.run(active_ranks, on_error="ignore")
    return {w: v for w, v in out.items() if isinstance(v, dict) and v}
