"""Cluster: the Dask cluster under a Lab, and ranks on it.

To be a Cluster it needs (1) a Dask client connected to a scheduler with workers, started here (the
embedded ``LocalCluster``, dask-cuda's on GPUs) or attached to (an address, a client), and (2) a
way to resize (only an embedded cluster has one). In return it gives what a Lab, a calibration
and a native run use: the workers as a ``ResourceSpec``, ``run_ranks`` (one pinned task per
worker, one rank each, the first failure stopping every rank), the torch threads each rank of a
subset gets, lost workers counted and restarted, and ``close``. It knows no Lab and no Run.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from distlab.cluster import local as _local
from distlab.cluster import spmd
from distlab.cluster.interrupts import interrupts_held
from distlab.cluster.slurm import SlurmJobs, SlurmSpec, start_slurm
from distlab.errors import LaunchError
from distlab.resources import ResourceSpec
from distlab.strategy.execution import rank_threads


class Cluster:
    """The embedded cluster (``Cluster(workers)``: one non-daemonic worker process per core on
    loopback; ``gpus=True``: one per GPU, or more sharing them) or one attached to
    (``address=``/``client=``, waiting up to ``timeout`` seconds for ``workers`` to join).
    ``on_fail()`` runs when it cannot start (its owner's clean-up)."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        address: str | None = None,
        client: Any = None,
        gpus: bool = False,
        security: Any = None,
        threads_per_worker: int | None = None,
        dashboard: bool | str = False,
        timeout: float = 60,
        on_fail: Callable[[], Any] | None = None,
        slurm: SlurmSpec | None = None,
        slurm_logs: Path | None = None,
    ) -> None:
        from distributed import Client

        self.timeout = timeout
        self.local: Any = None  # the embedded Dask cluster; None when attached
        self.jobs: SlurmJobs | None = None  # Lab(cluster="slurm")'s jobs: their client is attached to
        if slurm is not None:
            try:
                self.jobs = start_slurm(workers, slurm, timeout=timeout, log_dir=slurm_logs)
            except BaseException:
                if on_fail is not None:
                    on_fail()
                raise
            client = self.jobs.client
        self.own_client = client is None
        self._facts: dict[str, dict[str, Any]] = {}
        if client is not None:
            self.client = client
        elif address is not None:
            try:
                self.client = Client(address, security=security, timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - what Dask raises reading what is not its protocol
                if on_fail is not None:
                    on_fail()
                # a server that is not a Dask scheduler answers bytes Dask reads as frame sizes
                # (MemoryError "Unable to allocate 3.01 EiB"), or closes the connection
                first = (str(exc).splitlines() or [""])[0][:120]
                what = (
                    f"cannot reach the scheduler ({first})"
                    if isinstance(exc, OSError)
                    else "something answers there, but not a Dask scheduler"
                )
                raise LaunchError(
                    f"Lab(address={address!r}): {what}; give the address a Dask scheduler listens on "
                    "(`dask scheduler` prints it: tcp://HOST:8786) and check that it runs"
                ) from None
        if client is not None or address is not None:
            how = f"address={address!r}" if address else "client=..."
            _local.await_workers(self.client, workers or 1, timeout, how, self.own_client, on_fail)
        else:
            self.local, self.client = _local.start_local(
                workers,
                gpus=gpus,
                threads_per_worker=threads_per_worker,
                dashboard=dashboard,
                security=security,
                on_fail=on_fail,
            )
        self.client.run(_warm_torch)  # warm workers keep torch imported: a relaunch costs well under a second

    def settle(self) -> None:
        """Before a measurement: every worker done warming up (``_warm_torch``'s import)."""
        self.client.run(_warmed)

    @property
    def resources(self) -> ResourceSpec:
        """The live cluster: one rank per worker, ranks ordered by (host, worker address)."""
        return _local.resources_of(self.client, self._facts)

    def first(self, k: int, res: ResourceSpec | None = None) -> list[str]:
        """The addresses of the first ``k`` workers (of ``res``, else the live cluster): the workers
        a ``k``-rank run, measurement or calibration uses."""
        return list((res or self.resources).addresses)[:k]

    def threads_for(self, workers: list[str], res: ResourceSpec | None = None) -> list[int]:
        """The torch threads of each rank of a run on ``workers``: the cores of its host shared
        among the ranks there (``strategy/execution.rank_threads``)."""
        sub = (res or self.resources).of_workers(workers)
        return [rank_threads(len(sub.ranks_on(r.host)), sub.cores.get(r.host, 1)) for r in sub.ranks]

    def run_ranks(
        self,
        fn: Callable[..., Any],
        *args: Any,
        world: int | None = None,
        timeout: float | None = None,
        on_tick: Callable[[str], None] | None = None,
    ) -> list[Any]:
        """``fn(rank, world, master_addr, master_port, *args)`` once per rank on the first ``world``
        workers (default: all); results in rank order. One pinned Dask task per worker; the first
        failure stops every rank and raises a ``LaunchError`` summarising it. ``on_tick(what)`` is
        called (on the client's event thread) for each ``distlab.runtime.progress.tick(what)``
        rank 0 makes."""
        res = self.resources
        workers = self.first(world or res.world, res)
        if world is not None and world > len(workers):
            raise LaunchError(f"world: {world} ranks asked, the Lab has {len(workers)} workers")
        run_id = uuid.uuid4().hex[:8]
        topic = spmd.progress_topic(run_id)
        if on_tick is not None:
            self.client.subscribe_topic(topic, lambda event: on_tick(str(event[1].get("tick", ""))))
        group = spmd.start_ranks(
            self.client,
            workers,
            fn,
            args,
            run_id=run_id,
            threads=self.threads_for(workers, res),
            timeout=timeout or self.timeout,
            key_prefix="distlab-spmd",
        )
        name = getattr(fn, "__name__", "fn")
        try:
            with current_client(self.client):
                return group.wait(timeout)
        except spmd.RankFailure as exc:
            raise LaunchError(f"run_ranks({name}): {exc.summary()}") from None
        except spmd.WorkerLost as exc:
            now = len(spmd.workers_info(self.client))
            raise LaunchError(
                f"run_ranks({name}): {exc} while its ranks ran; the Lab has {now} worker(s) now: call it "
                "again (lab.resources shows them)"
            ) from None
        finally:
            group.close()
            if on_tick is not None:
                self.client.unsubscribe_topic(topic)

    def check_scalable(self) -> None:
        """An attached cluster is one ``LaunchError``: its own tool scales it."""
        if self.local is None:
            raise LaunchError(
                "lab.scale: this Lab is attached to a cluster it did not start; scale that cluster with its "
                "own tool (dask-jobqueue's cluster.scale(n), your Kubernetes deployment, more `dask worker` "
                "processes): the Lab uses the workers it finds"
            )

    def scale(self, n: int, within: float) -> int:
        """Resize the embedded cluster to ``n`` workers and wait up to ``within`` seconds for them;
        returns how many it has then (``check_scalable`` first)."""
        self.check_scalable()
        self.local.scale(n)
        deadline = time.monotonic() + within
        while len(spmd.workers_info(self.client)) != n and time.monotonic() < deadline:
            time.sleep(0.2)
        return len(spmd.workers_info(self.client))

    def retiring(self, k: int) -> list[str]:
        """The addresses of the ``k`` workers ``scale`` would retire to shrink the embedded
        cluster by ``k``: a LocalCluster (dask's SpecCluster) drops the newest entries of its
        worker spec first. None when attached (its own tool scales it)."""
        if self.local is None or k <= 0:
            return []
        names = {str(n) for n in list(self.local.worker_spec)[-k:]}
        workers = spmd.workers_info(self.client)
        return [addr for addr, info in workers.items() if str(info.get("name")) in names]

    @property
    def lost_workers(self) -> int:
        """How many of the embedded cluster's (or the Slurm jobs') workers are not running now (0
        when attached)."""
        if self.jobs is not None:
            return self.jobs.lost
        return _local.lost_workers(self.local, self.client)

    def lost_text(self, lost: int) -> str:
        """This cluster with ``lost`` workers gone, in a line: how many, what restarts them."""
        if self.jobs is not None:
            return self.jobs.lost_text(lost)
        return _local.lost_text(self.local, lost)

    def heal(self) -> None:
        """Restart the embedded cluster's lost workers (submit new Slurm jobs for ended ones) and
        wait for them (an attached cluster: nothing)."""
        if self.jobs is not None:
            self.jobs.heal(within=self.timeout)
        if self.local is not None:
            _local.heal_local_cluster(self.local, self.client, within=self.timeout)

    def close(self) -> None:
        """Close the client (when this Cluster made it) and the embedded cluster, whole: an interrupt
        meanwhile waits until both are closed."""
        with interrupts_held(reraise=False):
            if self.own_client:
                self.client.close()
            if self.local is not None:
                _local.close_quietly(self.local)
                self.local = None
        if self.jobs is not None:  # its client too; every job it submitted cancelled
            self.jobs.close()


@contextlib.contextmanager
def current_client(client: Any) -> Iterator[None]:
    """Dask calls that find their client themselves (``distributed.wait``, which a rank group's wait
    polls with) use ``client`` in this thread. Dask's default is the process's newest client: once
    a second Lab started, the first Lab's waits ran on the second's event loop, where the futures'
    asyncio events refused them ("bound to a different event loop") and the first Lab's run failed.
    (``Client.as_current()`` would also set Dask's global config from this thread.)"""
    try:
        from distributed.client import _current_client
    except ImportError:  # a Dask without it: the public form, Dask's config set for the while too
        with client.as_current():
            yield
        return
    token = _current_client.set(client)
    try:
        yield
    finally:
        _current_client.reset(token)


def _warm_torch() -> bool:
    import importlib
    import sys
    import threading

    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    # DDP's constructor and every optimizer's first add_param_group import torch._dynamo (about 2 s
    # here): imported now, beside the idle worker, rather than inside a run's first step
    if "torch._dynamo" not in sys.modules:
        warm = threading.Thread(target=importlib.import_module, args=("torch._dynamo",), daemon=True)
        warm.start()
    return True


def _warmed() -> bool:
    """(worker) Wait for ``_warm_torch``'s import (importing a module another thread is importing
    waits for it): a measurement must not share the cores with it."""
    import importlib

    importlib.import_module("torch._dynamo")
    return True
