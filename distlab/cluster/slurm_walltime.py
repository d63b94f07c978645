"""The walltime warning at launch: a run predicted to outlast what is left of its Slurm jobs' limit."""

from __future__ import annotations

import time
import warnings

from distlab.errors import DistlabWarning, LaunchError

WHO = "Lab(cluster='slurm')"  # how the Slurm errors name what the user called


class WalltimeWarning(DistlabWarning):
    """A run on Slurm is predicted to outlast its worker jobs' walltime."""


def parse_walltime(walltime: str) -> float:
    """Slurm's time limit (``-t``) in seconds: ``"MM"``, ``"MM:SS"``, ``"HH:MM:SS"``, ``"D-HH"``,
    ``"D-HH:MM"`` or ``"D-HH:MM:SS"`` (sbatch(1)); one ``LaunchError`` for anything else."""
    text = str(walltime).strip()
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", text
    parts = rest.split(":")
    try:
        numbers = [int(days), *(int(p) for p in parts)]
    except ValueError:
        numbers = []
    if len(parts) > 3 or not numbers or any(n < 0 for n in numbers):
        raise LaunchError(
            f"{WHO}: walltime={walltime!r} is not a Slurm time limit; give 'MM', 'HH:MM:SS' or 'D-HH:MM:SS'"
        )
    d, *hms = numbers
    if dash:  # after "D-" the first field is hours
        h, m, sec = (hms + [0, 0])[:3]
    else:  # without days: MM, MM:SS, HH:MM:SS
        h, m, sec = {1: (0, hms[0], 0), 2: (0, *hms), 3: tuple(hms)}[len(hms)]
    return float(((d * 24 + h) * 60 + m) * 60 + sec)


def predicted_run_seconds(steps: int | None, throughput: float, samples_per_step: int) -> float | None:
    """How long a run of ``steps`` steps of ``samples_per_step`` samples (the global batch) takes
    at the predicted ``throughput`` (samples/s); None when either is unknown (a user's loop, no
    prediction)."""
    if not steps or not throughput or throughput != throughput or throughput <= 0:
        return None
    return steps * samples_per_step / throughput


def check_walltime(
    walltime: str | None,
    started_at: float | None,
    predicted_seconds: float | None,
    *,
    now: float | None = None,
) -> str | None:
    """Warn (``WalltimeWarning``, one line) when a run predicted to take ``predicted_seconds``
    outlasts what is left of worker jobs of time limit ``walltime`` that started at
    ``started_at`` (seconds since the epoch: ``SlurmJobs.started_at()``); returns the warning's
    text, None when it fits or nothing is known (no walltime: the partition's limit)."""
    if walltime is None or started_at is None or predicted_seconds is None:
        return None
    left = parse_walltime(walltime) - ((time.time() if now is None else now) - started_at)
    if predicted_seconds <= left:
        return None
    message = (
        f"the run is predicted to take {_duration(predicted_seconds)}, but the Slurm worker jobs have "
        f"{_duration(max(left, 0.0))} of their walltime={walltime!r} left: it would stop at the limit and "
        "resume from its checkpoint on new jobs; ask for a longer walltime= or fewer steps"
    )
    warnings.warn(message, WalltimeWarning, stacklevel=2)
    return message


def _duration(seconds: float) -> str:
    """``3725`` -> ``"1 h 02 min"``; ``95`` -> ``"1 min 35 s"``; ``12`` -> ``"12 s"``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"
