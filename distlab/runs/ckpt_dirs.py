"""Where a Lab's checkpoints live on disk and how much of them is kept.

A run keeps one checkpoint while it can still resume (``checkpoint.save`` keeps the newest; the
previous one goes once the new one is on disk), and none once it has ended: a finished run's
weights are ``run.model``, and nothing resumes a run that failed or was cancelled. So a Lab uses
at most one checkpoint per running run. A Lab of its own folder (``dl.Lab()`` without
``checkpoint_dir=``) makes it in the temporary directory with an owner file (host, pid, the
process's start time); a kernel killed mid-run cannot remove its folder, so every new Lab removes
the folders of this host whose owner process is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

PREFIX = "distlab-ckpt-"
OWNER = "owner.json"


def make_own(root: str | Path | None = None) -> Path:
    """A new checkpoint folder for this process's Lab (after removing the orphans beside it)."""
    sweep_orphans(root)
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": _started(os.getpid())}
    (folder / OWNER).write_text(json.dumps(me))
    return folder


def sweep_orphans(root: str | Path | None = None) -> list[Path]:
    """Remove the checkpoint folders under ``root`` (the temporary directory) that a Lab of this
    host made and whose process has gone; the folders removed. A folder without an owner file
    (another tool's, or an older distlab's) is left alone."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = json.loads((folder / OWNER).read_text())
            mine = owner["host"] == socket.gethostname()
            gone = mine and not _alive(int(owner["pid"]), owner.get("started"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if gone:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _started(pid: int) -> float | None:
    """The process's start time (a pid reused by another process has another)."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - without it, the pid alone decides
        return None


def _alive(pid: int, started: float | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: not ours to judge
        return True
    now = _started(pid)
    return started is None or now is None or abs(now - started) < 1.0


def last(folder: str | Path | None) -> dict[str, Any] | None:
    """The newest checkpoint in a run's ``folder``: ``{"step", "at", "path"}`` (``at``: Unix time)."""
    from distlab.runtime import checkpoint

    path = checkpoint.newest(folder)
    if path is None:
        return None
    try:
        at = path.stat().st_mtime
    except OSError:
        return None
    return {"step": int(checkpoint.NAME.match(path.name).group(1)), "at": at, "path": str(path)}


def remove_run(folder: str | Path | None) -> None:
    """A run ended: nothing resumes it, so its checkpoints go."""
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def describe(info: dict[str, Any] | None, ended: bool) -> str:
    """The Run card's line: when the last checkpoint was taken, and whether it is still kept."""
    if info is None:
        return ""
    when = time.strftime("%H:%M:%S", time.localtime(info["at"]))
    if ended:
        return f"step {info['step']} at {when}; removed when the run ended"
    return f"step {info['step']} at {when} ({max(0.0, time.time() - info['at']):.0f} s ago), {info['path']}"
