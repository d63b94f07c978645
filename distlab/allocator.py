"""glibc malloc thresholds for training processes (Dask's worker defaults slow torch on CPU ~2x).

Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``. Setting any malloc threshold
turns off glibc's dynamic mmap threshold, so every tensor above 128 KiB is mmap-ed and unmapped on
free and its pages are faulted in again on the next step (datasets/measurements/README.md, "Figures
behind the code", has the convnet step it doubled). The thresholds below are glibc's own dynamic
ceilings (32 MiB mmap, twice that trim), so memory above them still goes back to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc's dynamic adjustment pairs with it

# the same, for processes about to start (the embedded cluster's nannies hand them to workers)
ENVIRON = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD}

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4  # mallopt parameters (malloc.h)
_DEFAULT_MMAP_MAX = 65536  # glibc's DEFAULT_MMAP_MAX
_HELD_TRIM = 2**31 - 1  # mallopt's int: the top of the heap is never trimmed while memory is held
_done: list[bool] = []
_held = {"depth": 0}
_lock = threading.Lock()


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 - musl has no mallopt: nothing to tune
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune_allocator() -> bool:
    """Set the thresholds in this process (glibc Linux only; idempotent). True when applied."""
    if _done:
        return _done[0]
    libc = _libc()
    ok = (
        libc is not None
        and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        and bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    )
    _done.append(ok)
    return ok


@contextmanager
def heap_cache() -> Iterator[bool]:
    """Inside the block, freed memory is kept for reuse, as a GPU's caching allocator keeps it;
    after it, what is free goes back to the system. Yields whether this applied (glibc only).

    A training step allocates the same tensors every step. glibc serves each one above 32 MiB
    (the most ``M_MMAP_THRESHOLD`` may be) with its own ``mmap``, unmapped when freed, so every
    step faults its pages in and zeroes them again: on a 42 MB MLP (a 36 MB weight gradient)
    about 9,400 page faults a step, 15-20 ms of its 33-40 ms of kernel time (115 ms of CPU), as
    much for torch's DDP as for distlab (getrusage around 50-step runs in a scratch script, not
    kept; the throughput it moved: datasets/measurements/ddp-2026-11-28b.json). With
    ``M_MMAP_MAX`` at 0
    (and no trimming of the heap's top) every allocation comes from the heap and a freed one is
    reused by the next step; at the end ``malloc_trim(0)`` returns the free pages, so a worker's
    memory after a run is what it was.
    Off the main thread (a Dask task's rank) a block above 64 MiB, the most a thread's heap
    holds, is still mapped and unmapped each time: a 400 MB layer's gradient gains nothing.
    """
    libc = _libc()
    if libc is None or not tune_allocator():
        yield False
        return
    with _lock:
        _held["depth"] += 1
        if _held["depth"] == 1:
            libc.mallopt(_M_MMAP_MAX, 0)
            libc.mallopt(_M_TRIM_THRESHOLD, _HELD_TRIM)  # a freed chunk at the heap's top stays too
    try:
        yield True
    finally:
        with _lock:
            _held["depth"] -= 1
            if _held["depth"] == 0:
                libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
                libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                libc.malloc_trim(0)
