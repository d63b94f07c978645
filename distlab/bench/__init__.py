"""Benchmarks as papermill notebooks: run one, interleave compared programs, write and read figures.

The baselines they compare against live beside the runner: ``distlab.bench.ddp`` (a plain DDP
loop and ``run_rank``, interleaved in one spawned group) and ``distlab.bench.spawn`` (the same
job launched without Dask).

Convention: ``notebooks/bench/NAME.ipynb`` has a code cell tagged ``parameters`` that sets at
least ``result_path``; its last cell calls ``write_result(result_path, rows, summary)``.
``distlab bench NAME -p key value`` executes it with papermill into ``out/bench/`` and prints
the rows as a table and the summary figures.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from distlab.errors import DistlabError
from distlab.files import write_atomic

BENCH_DIR = Path(__file__).resolve().parents[2] / "notebooks" / "bench"


def write_result(
    path: str | Path, rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any] | None = None
) -> Path:
    """Write a benchmark's figures as JSON (rows: the table; summary: the headline numbers)."""
    payload = {"rows": [dict(r) for r in rows], "summary": dict(summary or {}), "written": time.time()}
    return write_atomic(path, json.dumps(payload, indent=1, default=_jsonable))


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if hasattr(x, "tolist"):
        return x.tolist()
    return str(x)


def read_result(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def interleave(programs: Mapping[str, Callable[[], float]], repeats: int = 5) -> dict[str, list[float]]:
    """Run each program once per round, alternating the order every round; return all figures.

    Each program returns one figure (e.g. samples/s). Interleaving spreads the drift of a
    shared machine over every program instead of biasing whichever ran last.
    """
    names = list(programs)
    out: dict[str, list[float]] = {n: [] for n in names}
    for i in range(repeats):
        order = names if i % 2 == 0 else list(reversed(names))
        for n in order:
            out[n].append(float(programs[n]()))
    return out


def medians_and_ratio(
    figures: Mapping[str, Sequence[float]], numerator: str, denominator: str
) -> dict[str, float]:
    """Median of each program, and the median of per-round ratios numerator/denominator."""
    med = {f"{k}_median": statistics.median(v) for k, v in figures.items()}
    ratios = [a / b for a, b in zip(figures[numerator], figures[denominator]) if b]
    med["ratio_median"] = statistics.median(ratios) if ratios else float("nan")
    med["ratio_min"] = min(ratios) if ratios else float("nan")
    return med


def available() -> list[str]:
    return sorted(p.stem for p in BENCH_DIR.glob("*.ipynb"))


def run_bench(
    name: str,
    params: Mapping[str, Any] | None = None,
    out_dir: str | Path = "out/bench",
    progress: bool = True,
) -> dict[str, Any]:
    """Execute ``notebooks/bench/NAME.ipynb`` with papermill; return its result JSON."""
    from distlab.notebook.execute import execute_notebook

    src = BENCH_DIR / f"{name}.ipynb"
    if not src.exists():
        raise DistlabError(
            f"benchmark {name!r} does not exist; available: {', '.join(available()) or 'none'}"
        )
    out = Path(out_dir)
    result_path = (out / f"{name}.json").resolve()
    if result_path.exists():
        result_path.unlink()
    execute_notebook(
        src, out / f"{name}.ipynb", {**dict(params or {}), "result_path": str(result_path)}, progress=progress
    )
    if not result_path.exists():
        raise DistlabError(
            f"benchmark {name!r} ran but wrote no result; its last "
            "cell must call write_result(result_path, ...)"
        )
    return read_result(result_path)


def format_result(result: Mapping[str, Any]) -> str:
    import pandas as pd

    lines = []
    rows = result.get("rows") or []
    if rows:
        lines.append(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for k, v in (result.get("summary") or {}).items():
        lines.append(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    return "\n".join(lines)
