"""Per-step records of a run as a DataFrame, and the steady-state throughput measured from them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

COLUMNS = [
    "run_id",
    "step",
    "rank",
    "loss",
    "samples",
    "step_time",
    "comm_time",
    "wall_time",
    "restart",
    "world",
]


def frame(records: Iterable[Mapping[str, Any]]) -> Any:
    """Records -> DataFrame with ``COLUMNS`` (plus any extra keys the runtime sent), sorted."""
    import pandas as pd

    df = pd.DataFrame(list(records))
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = pd.Series(dtype="float64")
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[COLUMNS + extra]
    if len(df):
        df = df.sort_values(["restart", "step", "rank"], kind="stable").reset_index(drop=True)
    return df


class FrameCache:
    """``frame`` of records that arrive one by one, each turned into a row once: a live view of a
    30,000-step run asks for the frame every second, and building it from every record each time
    cost the notebook more than a core. ``add`` a record as it arrives (``new=False``: one that
    replaces an earlier record of the same restart, rank and step: the later is kept); ``frame()``
    is the whole frame, sorted, cached until the next record. Records are kept as rows (about
    100 bytes each), not as dicts (400 bytes to 1 KB each, 12-30 MB for 30,000 steps of two ranks
    before the frame's own): every ``CHUNK`` records become rows even if nobody asks for the frame."""

    CHUNK = 2048
    KEY = ["restart", "rank", "step"]

    def __init__(self, records: Iterable[Mapping[str, Any]] = ()) -> None:
        self._built: Any = None  # the frame of every record added before ``_pending``
        self._pending: list[Mapping[str, Any]] = list(records)
        self._sorted: Any = None
        self.stale = False  # a record replaced an earlier one: the next build keeps the later

    def add(self, record: Mapping[str, Any], new: bool = True) -> None:
        self._pending.append(record)
        self._sorted = None
        self.stale = self.stale or not new
        if len(self._pending) >= self.CHUNK:
            self._build()

    def _build(self) -> None:
        import pandas as pd

        if self._pending:  # (an empty frame is never kept: its float columns would turn ranks into 0.0)
            chunk = frame(self._pending)
            self._built = chunk if self._built is None else pd.concat([self._built, chunk], ignore_index=True)
            self._pending = []
        if self.stale and self._built is not None:
            self._built = self._built.drop_duplicates(self.KEY, keep="last").reset_index(drop=True)
            self.stale = False

    def frame(self) -> Any:
        if self._sorted is None:
            self._build()
            self._sorted = frame_sorted(self._built if self._built is not None else frame([]))
        return _with_hints(self._sorted.copy())  # the caller's to change


class NoSuchColumn(KeyError):
    """A column a run's metrics do not have: the runtime's own columns (``clock``, ``staleness``,
    ``heard``, ``weight``...) come with the records of the strategies that make them. A
    ``KeyError``, so pandas' ``get`` and ``in`` still work on the frame."""

    def __str__(self) -> str:
        return str(self.args[0])


_FRAME: Any = None


def _with_hints(df: Any) -> Any:
    """``df`` as a frame whose missing column says what the run has, or that it has recorded no
    step yet, instead of pandas' bare ``KeyError: "['staleness'] not in index"``."""
    global _FRAME
    if _FRAME is None:
        import pandas as pd

        class RunMetrics(pd.DataFrame):
            def __getitem__(self, key: Any) -> Any:
                try:
                    return super().__getitem__(key)
                except KeyError:
                    if not len(self):
                        raise NoSuchColumn(
                            f"distlab: run.metrics has no rows yet (the run has recorded no step), so no "
                            f"column {key!r} yet: run.wait(), or look again once it trains"
                        ) from None
                    wanted = key if isinstance(key, list) else [key]
                    missing = [k for k in wanted if k not in self.columns]
                    raise NoSuchColumn(
                        f"distlab: run.metrics has no column {', '.join(map(repr, missing)) or repr(key)}: "
                        f"this run's columns are {', '.join(map(str, self.columns))}"
                    ) from None

            def __reduce__(self) -> Any:  # pickled as the plain frame (this class is not importable)
                return pd.DataFrame(self).__reduce__()

        _FRAME = RunMetrics
    return _FRAME(df)


def frame_sorted(df: Any) -> Any:
    """``df`` in ``frame``'s order: restart, step, rank; ``COLUMNS`` first."""
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[COLUMNS + extra]
    if len(df):
        df = df.sort_values(["restart", "step", "rank"], kind="stable").reset_index(drop=True)
    return df


def warmup_steps(n: int) -> int:
    """Steps excluded as warm-up from a segment of ``n`` steps: 20%, at least 1, at most 10, keeping >= 1."""
    if n <= 1:
        return 0
    return min(10, max(1, n // 5), n - 1)


def throughput(df: Any) -> float:
    """Steady-state samples/s of the last segment (the final world size).

    ``samples`` in a record is the data position after that step (global samples seen), so a
    step's global samples are the difference to the previous step. A step's duration is the
    slowest rank's wall-clock interval between the end of the previous step and the end of this
    one (data loading and everything between steps count, as a user timing the loop would see).
    Throughput = median global samples per step / median step duration, over the steps after
    warm-up (``warmup_steps``). Medians, because a shared machine has outliers.
    """
    if df is None or len(df) == 0:
        return math.nan
    seg = df[df["restart"] == df["restart"].max()].sort_values(["rank", "step"])
    by_rank = seg.groupby("rank")
    seg = seg.assign(duration=by_rank["wall_time"].diff(), gsamples=by_rank["samples"].diff())
    per_step = seg.groupby("step").agg(
        samples=("gsamples", "max"), duration=("duration", "max"), ranks=("rank", "nunique")
    )
    per_step = per_step[per_step["ranks"] == per_step["ranks"].max()]
    per_step = per_step.iloc[max(1, warmup_steps(len(per_step))) :].dropna()
    if len(per_step) == 0:
        return math.nan
    dur = float(per_step["duration"].median())
    return float(per_step["samples"].median()) / dur if dur > 0 else math.nan


def slowest_median(per_rank: Sequence[Sequence[float]]) -> float:
    """Median over steps of the slowest rank's seconds: the statistic ``throughput`` takes of a run.

    ``per_rank``: each rank's seconds per step, aligned by step (every rank took the same steps).
    A synchronous step lasts as long as its slowest rank, and which rank is slowest changes from
    step to step on a shared machine, so this is not the slowest rank's median (evidence:
    docs/cost-model.md §History and evidence).
    """
    if not per_rank or not per_rank[0]:
        raise ValueError("slowest_median: no steps")
    if len({len(r) for r in per_rank}) != 1:
        raise ValueError(
            f"slowest_median: ranks took different numbers of steps ({[len(r) for r in per_rank]})"
        )
    return float(statistics.median(max(step) for step in zip(*per_rank)))
