"""Files distlab writes (calibrations, caches, strategies, benchmark figures) are written atomically:
a temporary file beside the target, renamed over it, so a crash leaves the old file or the new one,
never half of one."""

from __future__ import annotations

from pathlib import Path


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` (its folder created) through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
