"""A traced run as plain data for a replay: its spans, world, hosts, cores, samples per step and
strategy, from a live ``Run`` (``from_run``) or a saved Chrome trace (``load_chrome``).

A Chrome trace written by ``run.save_trace`` carries what the replay needs in ``otherData``
(``facts``); a trace saved by another tool, an untraced run or a truncated file gets one
``TraceError`` naming what is missing and how to get it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distlab.errors import DistlabError
from distlab.strategy.types import Strategy

FORMAT = "distlab-trace/1"
# the loop's spans every replay needs: without them a trace is not a distlab step
NEEDED = ("forward", "backward", "optimizer")


class TraceError(DistlabError):
    """A trace that cannot answer: the spans or facts a replay needs are missing."""


@dataclass
class TraceData:
    """What a replay reads from a traced run (see the module's docstring)."""

    spans: list[dict[str, Any]]  # name, cat, track, start, end (s), rank, step, args
    world: int
    hosts: list[str]  # per rank
    cores: dict[str, int | None] = field(default_factory=dict)  # per host
    samples_per_step: float = 0.0  # the global batch of one step
    strategy: Strategy | None = None
    optimizer: str | None = None
    source: str = "trace"

    @property
    def steps(self) -> list[int]:
        return sorted({int(e["step"]) for e in self.spans})


def facts(run: Any) -> dict[str, Any]:
    """What ``run.save_trace`` writes beside the spans so ``load_chrome`` rebuilds the replay."""
    from distlab.resources import host_of

    res = run.forecast.resources if run.forecast is not None else None
    hosts = [host_of(w) for w in run.workers]
    cores = {h: (res.cores.get(h) if res is not None else None) for h in hosts}
    return {
        "format": FORMAT,
        "hosts": hosts,
        "cores": cores,
        "samples_per_step": _samples_per_step(run),
        "strategy_json": run.strategy.to_json(indent=None),
        "optimizer": run.forecast.optimizer if run.forecast is not None else None,
    }


def _samples_per_step(run: Any) -> float:
    """The global batch of a step: rank 0's samples counter, step to step (the strategy's batch
    before any step was recorded)."""
    s = run.strategy
    fallback = float(s.batch.per_replica * s.batch.accumulation * s.world)
    try:
        df = run.metrics
        mine = df[df["rank"] == 0].sort_values("step")["samples"].diff().dropna()
        value = float(mine.median()) if len(mine) else math.nan
    except Exception:  # noqa: BLE001 - metrics are a refinement of the strategy's batch
        return fallback
    return value if value == value and value > 0 else fallback


def from_run(run: Any) -> TraceData:
    """The run's trace (its latest restart), or a ``TraceError`` saying how to get one."""
    events = run.trace_events
    if not events:
        how = (
            "launch it with trace=True (lab.launch(..., trace=True))" if not run.traced else "wait for steps"
        )
        if getattr(run, "backend", "torch") != "torch":
            how = "native TensorFlow runs are not traced: replay a run of the torch route (backend='torch')"
        raise TraceError(f"run {run.id}: has no trace to replay; {how}")
    restart = max(e["restart"] for e in events)
    spans = [e for e in events if e["restart"] == restart]
    f = facts(run)
    data = TraceData(
        spans=spans,
        world=int(run.world),
        hosts=f["hosts"],
        cores=f["cores"],
        samples_per_step=f["samples_per_step"],
        strategy=run.strategy,
        optimizer=f["optimizer"],
        source=f"run {run.id}",
    )
    check(data)
    return data


def load_chrome(path: str | Path) -> TraceData:
    """A Chrome trace saved by ``run.save_trace``, or a ``TraceError`` naming what is missing."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"{path}: no such file; save one with run.save_trace({str(path)!r})")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(
            f"{path}: not a complete JSON trace ({e.__class__.__name__} at {getattr(e, 'pos', '?')}); "
            "the file is truncated or not a trace: save it again with run.save_trace(path)"
        ) from None
    other = doc.get("otherData", {}) if isinstance(doc, dict) else {}
    if not isinstance(other, dict) or other.get("format") != FORMAT:
        found = other.get("format") if isinstance(other, dict) else None
        raise TraceError(
            f"{path}: not a distlab trace (otherData.format is {found!r}, "
            f"expected {FORMAT!r}); a replay needs the run's strategy, hosts and batch, which "
            "run.save_trace(path) writes beside the spans"
        )
    origin = float(other.get("origin_unix_s", 0.0))
    tracks: dict[tuple[int, int], str] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            name = e["args"]["name"]
            tracks[(e["pid"], e["tid"])] = "compute" if name == "training loop" else "comm"
    spans = []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or e.get("pid", 0) >= 10_000:  # the predicted process is not the run
            continue
        args = dict(e.get("args", {}))
        step = args.pop("step", None)
        if step is None:
            raise TraceError(
                f"{path}: span {e.get('name')!r} has no step in its args; save it again with run.save_trace"
            )
        start = origin + e["ts"] / 1e6
        spans.append(
            {
                "name": e["name"],
                "cat": e.get("cat", ""),
                "track": tracks.get((e["pid"], e["tid"]), "compute" if e["tid"] == 1 else "comm"),
                "start": start,
                "end": start + e["dur"] / 1e6,
                "rank": int(e["pid"]),
                "step": int(step),
                "restart": 0,
                "args": args,
            }
        )
    strategy = Strategy.from_json(other["strategy_json"]) if other.get("strategy_json") else None
    hosts = list(other.get("hosts") or [])
    world = len(hosts) or (strategy.world if strategy is not None else 0)
    data = TraceData(
        spans=spans,
        world=world,
        hosts=hosts or ["localhost"] * world,
        cores={k: (int(v) if v else None) for k, v in (other.get("cores") or {}).items()},
        samples_per_step=float(other.get("samples_per_step") or 0.0),
        strategy=strategy,
        optimizer=other.get("optimizer"),
        source=str(path),
    )
    check(data)
    return data


def check(data: TraceData) -> None:
    """Every rank has the loop's spans in at least one step, or one line saying what is missing."""
    if data.world < 1:
        raise TraceError(f"{data.source}: the trace names no ranks; save it again with run.save_trace(path)")
    for r in range(data.world):
        cats = {e["cat"] for e in data.spans if e["rank"] == r}
        missing = [c for c in NEEDED if c not in cats]
        if missing:
            raise TraceError(
                f"{data.source}: rank {r} has no {', '.join(missing)} span; the trace is truncated or the "
                "run recorded no step: trace a run of at least 2 steps (lab.launch(..., trace=True))"
            )
    if data.samples_per_step <= 0:
        raise TraceError(
            f"{data.source}: samples_per_step is missing; save the trace with run.save_trace(path)"
        )
