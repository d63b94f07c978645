"""What a restart costs a job: its checkpoint's size and a measured warm relaunch (Pollux: a fixed 30 s).

A reallocation pauses the run, writes its checkpoint, relaunches the ranks on the new workers and
reads the checkpoint back (``lab.scale``'s pause-checkpoint-resize-resume). The relaunch is
measured by the caller (the seconds from the stop to the first step on the new workers, less the
checkpoint's own time); the checkpoint's time is its size over the storage's measured rates.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from distlab.errors import SchedulerError

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile

# seconds a warm relaunch takes before any was measured on this Lab: the pause, new ranks and
# their first step on the 2-core development machine (a shared Lab measures its own from then on)
RELAUNCH_GUESS = 5.0


def checkpoint_bytes(profile: ModelProfile, optimizer_states: int = 2) -> int:
    """About what a checkpoint of ``profile``'s model holds: the weights and ``optimizer_states``
    copies of them (Adam's two moments; SGD with momentum one, plain SGD none)."""
    weights = sum(v.nbytes for v in profile.variables)
    return int(weights * (1 + optimizer_states))


def restart_seconds(
    nbytes: float, relaunch: float, write_rate: float, read_rate: float | None = None
) -> float:
    """Seconds one restart costs: write ``nbytes`` at ``write_rate`` (bytes/s), the measured warm
    ``relaunch`` (s), read it back at ``read_rate`` (``write_rate`` when None)."""
    read_rate = write_rate if read_rate is None else read_rate
    for name, value in (("nbytes", nbytes), ("relaunch", relaunch)):
        if not value >= 0:
            raise SchedulerError(f"restart_seconds: {name}={value}; give a size/time >= 0")
    for name, value in (("write_rate", write_rate), ("read_rate", read_rate)):
        if not value > 0:
            raise SchedulerError(f"restart_seconds: {name}={value}; give the measured bytes/s (> 0)")
    return float(relaunch + nbytes / write_rate + nbytes / read_rate)


def measure_storage(directory: str | Path | None = None, nbytes: int = 32 << 20) -> tuple[float, float]:
    """(write, read) bytes/s of a checkpoint-sized file in ``directory`` (a temporary one when None):
    written and fsynced as a checkpoint is, then read back."""
    if nbytes <= 0:
        raise SchedulerError(f"measure_storage: nbytes={nbytes}; give a positive size")
    payload = os.urandom(min(nbytes, 1 << 20))
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = Path(tmp) / "probe.ckpt"
        start = time.perf_counter()
        with open(path, "wb") as f:
            left = nbytes
            while left > 0:
                left -= f.write(payload[: min(left, len(payload))])
            f.flush()
            os.fsync(f.fileno())
        write = nbytes / (time.perf_counter() - start)
        start = time.perf_counter()
        with open(path, "rb") as f:
            while f.read(1 << 22):
                pass
        read = nbytes / (time.perf_counter() - start)
    return write, read


def estimate_relaunch(own: Sequence[float], start: float | None, others: Sequence[float]) -> float:
    """A run's warm relaunch (s): the median of its own measured relaunches; before any, its own
    measured first start (a relaunch ships the same job to ranks started the same way); before that,
    the median of the other runs' relaunches on this Lab; before any, ``RELAUNCH_GUESS``."""
    if own:
        return float(statistics.median(own))
    if start is not None:
        return float(start)
    return float(statistics.median(others)) if others else RELAUNCH_GUESS
