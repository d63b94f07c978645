"""The SPMD core: run one function once per rank on Dask workers, with a TCPStore rendezvous.

Design (DESIGN.md, Launch): one Dask task per rank, pinned with ``workers=[w]``,
``allow_other_workers=False``, ``pure=False`` and no retries (a retried rank would join a
process group that no longer exists). The rendezvous store is a ``TCPStore`` server on an
OS-chosen port, opened by a tiny task in rank 0's worker *before* the ranks start, and held in
that worker process's registry (``_STORES``) keyed by run id. Keeping the server out of the rank
itself means it can be closed from outside: closing it makes every rank still waiting in the
rendezvous fail at once, which is how a cancel or a missing rank ends quickly.

The registries below live in *worker* processes (never in the notebook), keyed by run id, and
are emptied by ``cleanup`` when a run segment ends. They are the only worker-side state.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import dask

from distlab.errors import LaunchError
from distlab.resources import host_of

# -- worker-process registries (keyed by run id) ----------------------------------------------
_STORES: dict[str, Any] = {}  # run id -> TCPStore server object
_STOPS: set[str] = set()  # run ids asked to stop
_ACTIVE: dict[str, set[int]] = {}  # run id -> ranks training in this process right now
_LOCK = threading.Lock()
STOP_GRACE = 5.0  # seconds ranks get to stop on their own before their workers are restarted


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
    failure = None
    try:
        return fn(rank, world, master_addr, master_port, *args)
    except BaseException as exc:  # summarise here: the client sees one picklable error per rank
        failure = RankFailure(rank, os.uname().nodename, type(exc).__name__, str(exc), traceback.format_exc())
    finally:
        if failure is not None:
            # The exception's frames hold the rank's process group (through DDP, optimizers...):
            # free them now, so its sockets close and the peers' collectives fail at once instead
            # of waiting for their timeout. Raising outside the except block keeps no __context__.
            gc.collect()
        progress.set_topic(None)
        with _LOCK:
            ranks = _ACTIVE.get(run_id)
            if ranks is not None:
                ranks.discard(rank)
                if not ranks:
                    _ACTIVE.pop(run_id, None)
    raise failure


class RankFailure(Exception):
    """A rank's exception, carried back to the client with its rank and traceback."""

    def __init__(self, rank: int, host: str, kind: str, message: str, tb: str = "") -> None:
        super().__init__(rank, host, kind, message, tb)
        self.rank, self.host, self.kind, self.message, self.tb = rank, host, kind, message, tb

    def summary(self) -> str:
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
    restarted: set[str] = field(default_factory=set)

    def stop(self) -> None:
        """Ask every rank to stop; they agree on a step through the store and return normally."""
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
        _broadcast(self.client, request_stop, self.run_id, self.workers)

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
        out = self.client.run(active_ranks, workers=alive, on_error="ignore")
        return [w for w, v in out.items() if isinstance(v, dict) and v.get(self.run_id)]

    def restart_stuck(self) -> None:
        """Last resort: restart the worker processes whose rank ignores the stop (e.g. blocked in a
        collective whose peer is gone). The Lab stays usable; those workers come back cold."""
        stuck = self.stuck()
        if stuck:
            self.restarted.update(stuck)
            try:
                self.client.restart_workers(stuck, timeout=60, raise_for_error=False)
            except Exception:  # noqa: BLE001 - the nanny may already be replacing it
                pass

    def settle(self, timeout: float) -> None:
        """After a failure: stop the other ranks, wait ``timeout`` s, then restart any still executing."""
        self.stop()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # ranks that never started are not waited for
            if not self.stuck():
                return
            time.sleep(0.1)
        self.restart_stuck()

    def wait(self, timeout: float | None, poll: float = 0.5) -> list[Any]:
        """Results in rank order; the first failure (or lost worker) raises, after the others settled.

        After ``stop()``, ranks get ``STOP_GRACE`` seconds to agree on a step and return; the
        workers of ranks still executing then are restarted.
        """
        from distributed import wait as dwait

        deadline = None if timeout is None else time.monotonic() + timeout
        pending = list(self.futures)
        while True:
            try:
                done, not_done = dwait(pending, timeout=poll, return_when="FIRST_COMPLETED")
            except TimeoutError:  # nothing finished within this poll
                done, not_done = set(), set(pending)
            for f in done:
                if f.status == "error":
                    exc = f.exception()
                    self.settle(STOP_GRACE)
                    raise (
                        exc
                        if isinstance(exc, RankFailure)
                        else RankFailure(self.futures.index(f), "?", type(exc).__name__, str(exc))
                    )
                if f.status == "cancelled":
                    self.settle(STOP_GRACE)
                    raise LaunchError(f"run {self.run_id}: a rank's task was cancelled by the scheduler")
            if not not_done:
                return [f.result() for f in self.futures]
            pending = list(not_done)
            lost = [w for w in self.workers if w not in self.alive()]
            if lost:
                fresh = [w for w in lost if w not in self.restarted]
                self.settle(STOP_GRACE)
                raise WorkerLost(fresh or lost)
            if self.stop_requested_at is not None and time.monotonic() - self.stop_requested_at > STOP_GRACE:
                self.restart_stuck()
            if deadline is not None and time.monotonic() > deadline:
                self.settle(STOP_GRACE)
                raise LaunchError(
                    f"run {self.run_id}: ranks did not finish within {timeout:g} s; raise timeout="
                )


class WorkerLost(Exception):
    """Workers of a run left the cluster while it ran."""

    def __init__(self, workers: Sequence[str]) -> None:
        super().__init__(f"worker(s) {', '.join(workers)} left the cluster")
        self.workers = list(workers)


def _broadcast(client: Any, fn: Callable[..., Any], run_id: str, workers: Sequence[str]) -> None:
    info = workers_info(client)
    alive = [w for w in workers if w in info]
    if alive:
        try:
            client.run(fn, run_id, workers=alive, on_error="ignore")
        except Exception:  # a worker leaving mid-call must not hide the run's own outcome
            pass


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
    port = client.submit(
        open_store,
        run_id,
        host,
        timeout,
        workers=[workers[0]],
        allow_other_workers=False,
        pure=False,
        key=f"distlab-store-{run_id}",
    ).result(timeout=timeout)
    group = RankGroup(client, run_id, tuple(workers), host, port)
    world = len(workers)
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
    return group


def active_on_cluster(client: Any) -> dict[str, dict[str, list[int]]]:
    """Per worker, the ranks still executing there (empty when nothing trains)."""
    out = client.run(active_ranks, on_error="ignore")
    return {w: v for w, v in out.items() if isinstance(v, dict) and v}
