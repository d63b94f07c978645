"""Spawn real processes as gloo ranks around one TCPStore and collect what each reports."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import queue
from collections.abc import Callable
from typing import Any

import pytest


def spawn_ranks(body: Callable[..., None], world: int, what: str, timeout: float = 90.0) -> dict[int, Any]:
    """``body(rank, world, store_port, out)`` in ``world`` spawned processes; each puts
    ``(rank, result)`` on ``out``. Returns the results by rank; fails the test when a rank has
    not reported within ``timeout`` seconds (``what`` names the ranks in that message)."""
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world + 1,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=30),
    )
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=body, args=(r, world, store.port, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(world):
            rank, result = out.get(timeout=timeout)
            results[rank] = result
    except queue.Empty:
        pytest.fail(f"{what} did not report within {timeout:g} s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return results
