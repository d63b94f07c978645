"""Files distlab writes (calibrations, caches, strategies, benchmark figures) are written atomically:
a temporary file beside the target, renamed over it, so a crash leaves the old file or the new one,
never half of one."""

from __future__ import annotations

import os
from pathlib import Path


def cache_home() -> Path:
    """Where distlab keeps what it measured (calibrations, models' steps, Slurm logs) unless a Lab
    is given ``cache_dir``: ``$DISTLAB_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/distlab``, else
    ``~/.cache/distlab`` (the XDG base-directory convention pip and Jupyter follow too)."""
    if own := os.environ.get("DISTLAB_CACHE_DIR"):
        return Path(own).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "distlab"


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` (its folder created) through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
