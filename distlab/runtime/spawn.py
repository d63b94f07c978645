"""spawn_local: run ranks as fresh local processes around a parent-hosted TCPStore (tests, baselines),
and ``process_context``: how distlab starts a process (these ranks, the embedded cluster's workers)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

from distlab.errors import LaunchError


def _child(
    rank: int, world: int, port: int, target: Callable, args: tuple, results: Any, threads: int | None
) -> None:
    from distlab.runtime.forkserver_preload import take_sigint_back

    take_sigint_back()  # a forkserver's child starts with it ignored
    import torch

    torch.set_num_threads(threads or max(1, (os.cpu_count() or 1) // world))
    try:
        out = target(rank, world, "127.0.0.1", port, *args)
        from distlab.runtime.job import RankJob

        if isinstance(out, RankJob):
            from distlab.runtime.trainer import run_rank

            out = run_rank(out)
        payload = pickle.dumps((rank, True, out))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        try:
            pickle.loads(pickle.dumps(exc))
            err: Any = exc
        except Exception:  # noqa: BLE001 - an exception that does not pickle travels as text
            err = LaunchError(f"rank {rank}: {type(exc).__name__}: {exc}")
        err.__distlab_traceback__ = traceback.format_exc()
        payload = pickle.dumps((rank, False, err))
    results.put(payload)


# what the forkserver imports once, so that each process it starts has them without importing
# (torch._dynamo: DDP's constructor and an optimizer's first step import it, 1.8 s here)
PRELOAD = ("distlab.runtime.forkserver_preload", "torch", "torch.distributed", "torch._dynamo")


def process_context() -> Any:
    """The multiprocessing context distlab starts processes with: a forkserver that imported torch
    once (``PRELOAD``), where the platform has one; else spawn.

    A spawned process imports torch again (1.6 s of CPU here, and 1.8 s more for torch._dynamo,
    per process: a Lab's two workers and every rank spawn_local starts paid it, on the cores the
    runs use); a forkserver's child is a
    fork of a process that imported those modules and ran nothing else (no Python thread of its
    own, no CUDA context; the parent's ``sys.path`` and ``__main__`` applied as spawn applies
    them), and two of them started in 0.04 s here against 3 s spawned. Its children start with SIGINT ignored
    (runtime/forkserver_preload.py). Dask's own preloads (when Dask chose the forkserver first:
    ``distributed.utils.get_mp_context``) are kept."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    server = forkserver._forkserver  # the one forkserver of this process
    if getattr(server, "_forkserver_pid", None) is None:  # not started: its preloads can still change
        # not "__main__" (multiprocessing's default): the server runs no code of the user's script;
        # each child imports the script's top level as a spawned one does
        have = [m for m in getattr(server, "_preload_modules", ()) if m != "__main__"]
        ctx.set_forkserver_preload(have + [m for m in PRELOAD if m not in have])
    return ctx


def spawn_local(
    world: int,
    target: Callable[..., Any],
    *args: Any,
    timeout: float = 120.0,
    threads: int | None = None,
    return_errors: bool = False,
) -> list[Any]:
    """Start ``world`` processes; rank r calls ``target(r, world, "127.0.0.1", port, *args)``.

    ``target`` must be importable (a module-level function). If it returns a ``RankJob``, the
    child runs ``run_rank`` on it and returns that result; otherwise its return value comes
    back. Returns the results by rank. A rank that raised makes this raise its error (the
    lowest failing rank's, original type kept) unless ``return_errors`` puts the exceptions
    in the list instead. Never hangs: after ``timeout`` seconds every child is killed and a
    ``LaunchError`` names the ranks that had not finished.
    """
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, wait_for_workers=False)
    ctx = process_context()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_child, args=(r, world, store.port, target, args, results, threads), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    out: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(out) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world)) - set(out))
                raise LaunchError(
                    f"spawn_local: ranks {missing} did not finish within {timeout:g} s; raise timeout or "
                    "look for a hang"
                )
            try:
                rank, ok, value = pickle.loads(results.get(timeout=min(left, 0.5)))
                out[rank] = (ok, value)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode is not None]
                if dead:  # died without reporting (killed, segfault): give the queue a moment
                    time.sleep(0.5)
                    if results.empty():
                        for r in dead:
                            out[r] = (
                                False,
                                LaunchError(
                                    f"rank {r}: process exited with code {procs[r].exitcode} without a result"
                                ),
                            )
    finally:
        failing = len(out) < world  # past the timeout, or interrupted: a rank still running is hung
        for p in procs:
            if failing and p.is_alive():
                p.kill()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    values = [out[r][1] for r in range(world)]
    if not return_errors:
        for r in range(world):
            if not out[r][0]:
                raise values[r]
    return values
