"""Start or attach to the Dask cluster a Lab owns, and describe it as a ResourceSpec."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import time
from pathlib import Path
from typing import Any

from distlab.allocator import ENVIRON as MALLOC_ENVIRON
from distlab.cluster.interrupts import interrupts_held, sigint_blocked
from distlab.cluster.spmd import workers_info
from distlab.errors import LaunchError
from distlab.resources import ResourceSpec, available_cores

# Read when the worker processes start (the nanny hands them the config), so scoping is enough.
WORKER_CONFIG = {
    "distributed.worker.daemon": False,  # ranks may start DataLoader worker processes
    # the statistical profiler samples the task thread's stack every 10 ms, taking the GIL from
    # the training loop; the embedded cluster trains, it does not need to profile itself
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.gil.enabled": False,
    # every worker's, nanny's and the scheduler's event loop wakes on timers, each wake-up taking
    # a core from the ranks (a rank with 2 threads waits for the slower one every op): Dask's
    # 20 ms loop tick, 100 ms memory check and 500 ms system monitor, quieter here (evidence:
    # datasets/measurements/README.md, "Figures behind the code"). Nothing here spills: memory is
    # still checked every 2 s
    "distributed.admin.tick.interval": "500ms",
    "distributed.admin.tick.limit": "10s",  # a loop blocked this long is logged
    "distributed.worker.memory.monitor-interval": "2s",
    "distributed.admin.system-monitor.interval": "2s",
    # Dask's default MALLOC_TRIM_THRESHOLD_=65536 makes torch on CPU ~2x slower (allocator.py)
    "distributed.nanny.pre-spawn-environ": {
        **MALLOC_ENVIRON,
        "OMP_NUM_THREADS": 1,  # ranks set torch's thread count themselves
        "MKL_NUM_THREADS": 1,
        "OPENBLAS_NUM_THREADS": 1,
    },
}


def start_local(
    workers: int | None,
    *,
    gpus: bool,
    threads_per_worker: int | None,
    dashboard: bool | str,
    security: Any,
    on_fail: Any = None,
) -> tuple[Any, Any]:
    """The embedded cluster and its client. An interrupt (Ctrl-C, the notebook's stop button) is
    held until both are up, then both are closed and it is raised: one that struck half-way left
    worker processes no Lab held. ``on_fail()`` runs when the start fails or is interrupted."""
    from distributed import Client

    cluster = client = None
    try:
        with interrupts_held(), sigint_blocked():
            cluster = start_local_cluster(
                workers,
                gpus=gpus,
                threads_per_worker=threads_per_worker,
                dashboard=dashboard,
                security=security,
            )
            client = Client(cluster, security=security)
        return cluster, client
    except BaseException as exc:
        with interrupts_held(reraise=False):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()
            if cluster is not None:
                with contextlib.suppress(Exception):
                    close_quietly(cluster)
        if on_fail is not None:
            on_fail()
        if isinstance(exc, Exception) and unguarded_script():
            raise LaunchError(
                "Lab(): the worker processes could not start: this script starts a Lab at its top "
                "level, and each spawned worker re-runs the script; put the code under "
                '`if __name__ == "__main__":`'
            ) from None
        raise


def start_local_cluster(
    workers: int | None, *, gpus: bool, threads_per_worker: int | None, dashboard: bool | str, security: Any
) -> Any:
    """The embedded cluster: loopback only, non-daemonic worker processes, one rank per worker.

    ``WORKER_CONFIG`` is set while the workers are spawned, and each nanny (those that replace
    lost ones too) is handed a deep copy of the whole config with it for the worker processes it
    starts: a nanny's own copy is shallow, so once the scope ended, a worker it started again
    after a crash ran with Dask's defaults (its loop ticking every 20 ms, its profiler on).
    ``distributed.worker.daemon`` is set for good: a nanny reads it from this process's config
    each time it starts a worker process.
    """
    import dask

    dask.config.set({"distributed.worker.daemon": False})
    use_forkserver()

    dashboard_address = (
        None if not dashboard else (dashboard if isinstance(dashboard, str) else "127.0.0.1:8787")
    )
    n = workers or available_cores()
    with dask.config.set(WORKER_CONFIG):
        config = copy.deepcopy(dask.config.config)  # Nanny(config=): the nannies' own, whole
        if gpus:
            return _start_cuda_cluster(workers, threads_per_worker, dashboard_address, security, config)
        from distributed import LocalCluster

        return LocalCluster(**_local_kwargs(n, threads_per_worker, dashboard_address, security, config))


def use_forkserver() -> None:
    """Worker processes (and those that replace lost ones) start from a forkserver that imported
    torch once (runtime/spawn.py ``process_context``), not spawned to import it again: where the
    platform has one and Dask's ``distributed.worker.multiprocessing-method`` is at its default
    ("spawn", which is switched); another value set before the Lab starts ("fork") is kept. Set for good, as
    ``distributed.worker.daemon`` is: a nanny reads it each time it starts a worker process."""
    import multiprocessing

    import dask

    key = "distributed.worker.multiprocessing-method"
    if dask.config.get(key) == "spawn" and "forkserver" in multiprocessing.get_all_start_methods():
        dask.config.set({key: "forkserver"})
    if dask.config.get(key) == "forkserver":
        from distributed.utils import get_mp_context

        from distlab.runtime.spawn import process_context

        get_mp_context()  # Dask's preloads first (once per process), then torch beside them
        process_context()


def _local_kwargs(
    n: int, threads_per_worker: int | None, dashboard_address: Any, security: Any, config: dict
) -> dict[str, Any]:
    """A LocalCluster's arguments: ``n`` worker processes on loopback, each nanny with ``config``."""
    kwargs: dict[str, Any] = {
        "n_workers": n,
        "threads_per_worker": threads_per_worker or 1,
        "processes": True,
        "host": "127.0.0.1",
        "dashboard_address": dashboard_address,
        "silence_logs": 50,
        "config": config,
        "preload": [__name__],  # dask_setup below, in each worker process
    }
    if dashboard_address is None:
        # the scheduler always serves HTTP (health, metrics): keep it off the fixed port 8787
        kwargs["scheduler_kwargs"] = {"dashboard_address": "127.0.0.1:0"}
    if security is not None:
        kwargs["security"] = security
    return kwargs


def await_workers(client: Any, n: int, timeout: float, how: str, own_client: bool, cleanup: Any) -> None:
    """An attached Lab starts once ``n`` workers have joined the scheduler (workers started by
    hand or by a job queue arrive late), or says how many came within ``timeout``."""
    try:
        client.wait_for_workers(n, timeout=timeout)
    except (TimeoutError, OSError):
        have = len(workers_info(client))
        start = f"dask worker {client.scheduler.address}"
        if own_client:
            client.close()
        if cleanup is not None:
            cleanup()
        came = f"{have} of {n} worker(s)" if have else "no worker"
        fix = f"give workers={have}, start more ({start})" if have else f"start some ({start})"
        raise LaunchError(
            f"Lab({how}): {came} joined the scheduler within {timeout:g} s; {fix}, or give a longer timeout="
        ) from None


def lost_workers(cluster: Any, client: Any) -> int:
    """How many of the embedded ``cluster``'s workers are not running now (0 when attached)."""
    if cluster is None:
        return 0
    try:
        return max(0, len(cluster.worker_spec) - len(workers_info(client)))
    except Exception:  # noqa: BLE001 - a scheduler that does not answer: nothing to say here
        return 0


def lost_text(cluster: Any, lost: int) -> str:
    """An embedded cluster with ``lost`` workers, in its Lab's repr: how many, what restarts them."""
    expected = len(cluster.worker_spec) if cluster is not None else lost
    return (
        f"{expected - lost} of {expected} workers running ({lost} lost: lab.heal() or the next launch "
        "restarts them)"
    )


def close_quietly(cluster: Any) -> None:
    """Close an embedded cluster, Dask's log as quiet after as before: a LocalCluster silences the
    ``distributed`` logger's stream handlers while it lives and restores their levels when it
    closes, so after a notebook changed clusters the next one's close printed its nannies' INFO
    lines in the cell."""
    import logging

    handlers = [h for h in logging.getLogger("distributed").handlers if isinstance(h, logging.StreamHandler)]
    levels = [h.level for h in handlers]
    try:
        cluster.close()
    finally:
        for handler, level in zip(handlers, levels):
            handler.setLevel(level)


def dask_setup(worker: Any) -> None:  # noqa: ARG001 - Dask's preload hook signature
    """(each embedded worker process, as it starts) Leave the notebook kernel's process group:
    JupyterLab's stop button signals the kernel's whole group, and a SIGINT there killed every
    worker. A run in flight is still cancelled from the kernel (``Run.wait`` catches the
    interrupt and cancels the ranks); the worker itself still exits with its nanny."""
    if hasattr(os, "setsid"):
        try:
            os.setsid()
        except OSError:  # already a session leader
            pass
    from distlab.runtime.forkserver_preload import take_sigint_back

    take_sigint_back()  # a worker the forkserver started ignored SIGINT until here


def heal_local_cluster(cluster: Any, client: Any, within: float) -> int:
    """Make the embedded cluster whole again before a run; returns how many workers it has.

    A worker that was killed or restarted comes back through its nanny (cold, in seconds). A
    nanny that gave up (its new worker process failed to start, e.g. on an overloaded machine),
    one whose worker is still missing after ``within / 2`` seconds, and one the cluster itself
    dropped after ``distributed.deploy.lost-worker-timeout`` are replaced by fresh nannies.
    Waits at most ``within`` seconds.
    """
    import dask
    from distributed.core import Status

    expected = len(cluster.worker_spec)
    start = time.monotonic()
    while (n := len(info := workers_info(client))) < expected and time.monotonic() - start < within:
        present = {str(w.get("id")) for w in info.values()}
        stale = time.monotonic() - start > within / 2
        gone = [
            name
            for name, nanny in cluster.workers.items()
            if nanny.status in (Status.closed, Status.failed) or (stale and str(name) not in present)
        ]
        # SpecCluster itself closes and forgets a nanny whose worker stayed away longer than
        # distributed.deploy.lost-worker-timeout, but keeps its spec: nothing would start it again
        orphaned = set(cluster.worker_spec) - set(cluster.workers)
        if not gone and not orphaned:
            time.sleep(0.2)
            continue
        for name in gone:
            nanny = cluster.workers.pop(name, None)
            cluster.worker_spec.pop(name, None)
            if nanny is not None and nanny.status not in (Status.closed, Status.failed):
                try:
                    cluster.sync(nanny.close, timeout=10)
                except Exception:  # noqa: BLE001 - a nanny that cannot close is dropped all the same
                    pass
        while len(cluster.worker_spec) < expected:
            cluster.worker_spec.update(cluster.new_worker_spec())
        try:
            with dask.config.set(WORKER_CONFIG):  # the new nannies copy the config as they are made
                cluster.sync(cluster._correct_state)
        except Exception:  # noqa: BLE001 - a replacement that failed to start is replaced next round
            time.sleep(0.5)
    return n


def _start_cuda_cluster(
    workers: int | None, threads_per_worker: int | None, dashboard_address: Any, security: Any, config: dict
) -> Any:
    """One worker per GPU (dask-cuda's ``LocalCUDACluster``); more workers than GPUs share them in
    turn (``SharedGPUCluster``: ranks on one device then exchange over gloo, see runs/train.py)."""
    import torch

    if not torch.cuda.is_available():
        raise LaunchError(
            "Lab(gpus=True): torch sees no CUDA device on this machine; use Lab() for CPU workers"
        )
    if workers and workers > torch.cuda.device_count():
        devices = [str(i) for i in range(torch.cuda.device_count())]
        return SharedGPUCluster(
            devices, **_local_kwargs(workers, threads_per_worker, dashboard_address, security, config)
        )
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        raise LaunchError(
            "Lab(gpus=True) needs dask-cuda; install it with `pip install "
            "dask-cuda` (or use Lab() for CPU workers)"
        ) from None
    kwargs: dict[str, Any] = {
        "host": "127.0.0.1",
        "dashboard_address": dashboard_address,
        "threads_per_worker": threads_per_worker or 1,
        # no config=: LocalCUDACluster passes its own (UCX) to LocalCluster; its nannies copy this
        # process's config, WORKER_CONFIG included, as they start (seen on an H100, dask-cuda 26.10)
    }
    if dashboard_address is None:
        kwargs["scheduler_kwargs"] = {"dashboard_address": "127.0.0.1:0"}
    if workers:
        kwargs["n_workers"] = workers
    if security is not None:
        kwargs["security"] = security
    return LocalCUDACluster(**kwargs)


def worker_facts() -> dict[str, Any]:
    """(worker) What a rank placed here can use: cores and the GPU it sees, if any."""
    facts: dict[str, Any] = {"cores": available_cores(), "gpu": None}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        facts["gpu"] = visible.split(",")[0]
    return facts


def resources_of(client: Any, facts_cache: dict[str, dict[str, Any]]) -> ResourceSpec:
    """The live cluster as a ResourceSpec: one rank per worker, ordered by (host, worker address).

    ``ResourceSpec.from_client`` builds it from a snapshot of the scheduler's workers (asked
    directly, see ``spmd.workers_info``) and the cores and GPU each worker reported (cached).
    """
    info = workers_info(client)
    missing = [w for w in info if w not in facts_cache]
    if missing:
        facts_cache.update(client.run(worker_facts, workers=missing, on_error="ignore"))
    facts = {w: f for w, f in facts_cache.items() if w in info and isinstance(f, dict)}
    return ResourceSpec.from_client(_Snapshot(info), facts)


class _Snapshot:
    """A client stand-in for ``ResourceSpec.from_client``: the workers as they were just read."""

    def __init__(self, workers: dict[str, Any]) -> None:
        self._workers = workers

    def scheduler_info(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {"workers": self._workers}


def unguarded_script() -> bool:
    """The program is a script (not a notebook or a REPL) that did not reach its code through an
    ``if __name__ == "__main__":`` block: spawned workers re-import it and start Labs of their own."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not str(path).endswith(".py"):
        return False
    try:
        text = Path(path).read_text()
    except OSError:
        return False
    return "__name__" not in text or "__main__" not in text


def _shared_gpu_cluster_class() -> Any:
    from distributed import LocalCluster

    class _SharedGPUCluster(LocalCluster):
        """A LocalCluster whose workers see one GPU each, in turn over ``devices`` (worker i sees
        ``devices[i % len(devices)]``), replacements included: more ranks than GPUs on one host."""

        def __init__(self, devices: list[str], n_workers: int, **kwargs: Any) -> None:
            self.devices = devices
            super().__init__(n_workers=0, **kwargs)  # LocalCluster's first workers skip new_worker_spec
            self.scale(n_workers)
            self.sync(self._correct_state)

        def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
            ((name, spec),) = super().new_worker_spec().items()
            spec = copy.deepcopy(spec)
            used = [
                s["options"].get("env", {}).get("CUDA_VISIBLE_DEVICES") for s in self.worker_spec.values()
            ]
            device = min(self.devices, key=lambda d: (used.count(d), self.devices.index(d)))
            spec["options"].setdefault("env", {})["CUDA_VISIBLE_DEVICES"] = device
            return {name: spec}

    return _SharedGPUCluster


def SharedGPUCluster(devices: list[str], **kwargs: Any) -> Any:  # noqa: N802 - a class, built lazily
    """``LocalCluster`` with workers sharing ``devices`` in turn (distributed imported on use)."""
    return _shared_gpu_cluster_class()(devices, **kwargs)
