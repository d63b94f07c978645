"""spawn_local: run ranks as fresh local processes around a parent-hosted TCPStore (tests, baselines)."""

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
    ctx = mp.get_context("spawn")
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
        for p in procs:
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
