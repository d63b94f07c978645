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

MMAP_THRESHOLD = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc's dynamic adjustment pairs with it

# the same, for processes about to start (the embedded cluster's nannies hand them to workers)
ENVIRON = {"MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD, "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD}

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_done: list[bool] = []


def tune_allocator() -> bool:
    """Set the thresholds in this process (glibc Linux only; idempotent). True when applied."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            )
        except (OSError, AttributeError):  # musl or another libc: nothing to tune
            ok = False
    _done.append(ok)
    return ok
