"""A traced run's timeline (``lab.launch(..., trace=True)``; runtime/trace.py records it).

``chrome_trace(run)`` is the Chrome trace-event JSON Perfetto and ``chrome://tracing`` open: one
process per rank (named with its host) with a thread for its training loop (forward, backward,
the wait for gradients, the optimizer, sparse exchanges, PS pulls, gossip) and threads for the
collectives in flight (each bucket's all-reduce and each PS reduce, from launch to completion;
collectives run at once on a process group's several threads, so each that overlaps the ones
before it takes the next lane) — complete ("X") events in microseconds since the first span
(``otherData["origin_unix_s"]`` on rank 0's clock), no two overlapping on one thread. With a
prediction, a "predicted" process draws the cost model's step for the same strategy.

``timeline_figure(run, steps)`` draws the same for a few steps with plotly: a row per rank and
thread, hover with bytes and peers, and the predicted steps below the measured ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distlab.errors import LaunchError
from distlab.whatif.trace import facts

TRACKS = {"compute": (1, "training loop"), "comm": (2, "collectives in flight")}


def _tid(e: dict[str, Any]) -> int:
    return TRACKS[e["track"]][0] + e.get("lane", 0)


def _row(e: dict[str, Any]) -> str:
    who = e.get("who") or (f"rank {e['rank']}" if e["rank"] >= 0 else "predicted")
    lane = f" ({e['lane'] + 1})" if e.get("lane") else ""
    return f"{who} · {TRACKS[e['track']][1]}{lane}"


COLOURS = {
    "forward": "#9ecae9",
    "backward": "#4c78a8",
    "compute": "#eeca3b",  # the prediction's forward + backward: its own colour beside backward's
    "wait": "#bab0ac",
    "slowdown": "#d6616b",  # a straggler's wait (lab.launch(..., slowdown=...))
    "optimizer": "#54a24b",
    "allreduce": "#f58518",
    "allgather": "#e45756",
    "ps": "#b279a2",
    "gossip": "#72b7b2",
    "predicted": "#9d755d",
}
PREDICTED_PID = 10_000  # the predicted step's process in the trace


def spans(run: Any, steps: int | None = None) -> list[dict[str, Any]]:
    """The run's spans (of its latest restart, of its last ``steps`` steps when given), each with
    rank, step, track and start/end in seconds on rank 0's clock, no two overlapping on one track."""
    events = run.trace_events
    if not events:
        how = "launch it with trace=True" if not run.traced else "it recorded no step yet"
        raise LaunchError(f"run {run.id}: no trace ({how})")
    restart = max(e["restart"] for e in events)
    events = [e for e in events if e["restart"] == restart]
    if steps is not None:
        last = max(e["step"] for e in events)
        events = [e for e in events if e["step"] > last - steps]
    out = []
    for key in sorted({(e["rank"], e["track"]) for e in events}):
        mine = sorted(
            (e for e in events if (e["rank"], e["track"]) == key), key=lambda e: (e["start"], e["end"])
        )
        if key[1] == "comm":  # collectives run concurrently (gloo has two threads): a lane each, greedily
            lanes: list[float] = []  # each lane's last end
            for e in mine:
                lane = next((i for i, end in enumerate(lanes) if end <= e["start"]), None)
                if lane is None:
                    lanes.append(e["end"])
                    lane = len(lanes) - 1
                else:
                    lanes[lane] = e["end"]
                out.append({**e, "lane": lane})
            continue
        end = -float("inf")
        for e in mine:  # one thread: its spans follow each other (clocks read at their edges)
            start = max(e["start"], end)
            end = max(e["end"], start)
            out.append({**e, "start": start, "end": end, "lane": 0})
    return out


def predicted_spans(run: Any, steps: int, t0: float) -> list[dict[str, Any]]:
    """The cost model's step for the run's strategy, ``steps`` times from ``t0``: forward and
    backward, exposed communication and the optimizer on the loop; the gradient collectives in
    flight, overlapping backward as the model has them."""
    p = run.forecast.prediction if run.forecast else None
    if p is None:
        return []
    b, d = p.breakdown, p.detail
    out = []
    for k in range(steps):
        s = t0 + k * p.step_time
        loop = [
            ("forward + backward (predicted)", "compute", b["compute"]),
            ("exposed communication (predicted)", "wait", b["comm"]),
            ("optimizer (predicted)", "optimizer", b["optimizer"]),
        ]
        for name, cat, dur in loop:
            out.append(
                {
                    "name": name,
                    "cat": cat,
                    "start": s,
                    "end": s + dur,
                    "track": "compute",
                    "rank": -1,
                    "step": k,
                    "args": {},
                }
            )
            s += dur
        total = d.get("backward_total", 0.0)
        if total > 0:
            end = t0 + k * p.step_time + b["compute"] + d.get("backward", 0.0)
            out.append(
                {
                    "name": "gradient collectives (predicted)",
                    "cat": "allreduce",
                    "start": end - total,
                    "end": end,
                    "track": "comm",
                    "rank": -1,
                    "step": k,
                    "args": {},
                }
            )
    return out


def chrome_trace(run: Any, predicted: bool = True) -> dict[str, Any]:
    """The run's trace as Chrome trace-event JSON (see the module's docstring)."""
    measured = spans(run)
    from distlab.resources import host_of

    hosts = {r: host_of(w) for r, w in enumerate(run.workers)}
    events: list[dict[str, Any]] = []
    for r in sorted({e["rank"] for e in measured}):
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": r,
                "tid": 0,
                "args": {"name": f"rank {r}" + (f" ({hosts[r]})" if r in hosts else "")},
            }
        )
        events.append(
            {"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}}
        )
    origin = min(e["start"] for e in measured)  # microseconds from here: exact in float64, unlike Unix time
    extra = predicted_spans(run, 1, origin) if predicted else []
    if extra:
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": PREDICTED_PID,
                "tid": 0,
                "args": {"name": "predicted (cost model)"},
            }
        )
    for e in {(_pid(e), _tid(e)): e for e in measured + extra}.values():
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": _pid(e),
                "tid": _tid(e),
                "args": {"name": _row(e).split(" · ")[1]},
            }
        )
    for e in measured + extra:
        events.append(
            {
                "ph": "X",
                "name": e["name"],
                "cat": e["cat"],
                "pid": _pid(e),
                "tid": _tid(e),
                "ts": (e["start"] - origin) * 1e6,
                "dur": (e["end"] - e["start"]) * 1e6,
                "args": {**e.get("args", {}), "step": e["step"]},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "run_id": run.id,
            "strategy": run.strategy.name,
            "world": run.world,
            "origin_unix_s": origin,
            **facts(run),  # what dl.whatif.load needs to replay the trace
        },
    }


def save_trace(run: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(run)))
    return path


def timeline_figure(run: Any, steps: int = 3, predicted: bool = True) -> Any:
    """Plotly: a row per rank and thread over the last ``steps`` steps, the predicted step below."""
    measured = spans(run, steps)
    t0 = min(e["start"] for e in measured)
    extra = predicted_spans(run, steps, t0) if predicted else []
    shown = [dict(e, start=e["start"] - t0, end=e["end"] - t0) for e in measured + extra]
    return spans_figure(
        shown, f"{run.strategy.name}: the last {steps} step(s) per rank (ms), predicted below"
    )


def spans_figure(shown: list[dict[str, Any]], title: str) -> Any:
    """Plotly: a row per rank (or ``who``) and thread, spans in seconds from 0; rows without a
    rank of their own (predicted, what-if) below the ranks."""
    from distlab.notebook.figures import THEME, Figure

    def order(e: dict[str, Any]) -> tuple[int, str, int]:
        return (
            0 if e["rank"] >= 0 and not e.get("who") else 1,
            e.get("who") or "",
            max(e["rank"], 0) * 100 + _tid(e),
        )

    rows = list(dict.fromkeys(_row(e) for e in sorted(shown, key=order)))
    fig = Figure()
    for cat in COLOURS:
        mine = [e for e in shown if e["cat"] == cat]
        if not mine:
            continue
        fig.add_bar(
            orientation="h",
            base=[e["start"] * 1e3 for e in mine],
            x=[(e["end"] - e["start"]) * 1e3 for e in mine],
            y=[_row(e) for e in mine],
            name=cat,
            marker_color=COLOURS[cat],
            customdata=[_hover(e) for e in mine],
            hovertemplate="%{customdata}<extra></extra>",
        )
    fig.update_layout(
        template=THEME,
        barmode="overlay",
        height=140 + 34 * len(rows),
        title={"text": title, "y": 0.97},
        xaxis_title="ms since the first step shown",
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1]},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
        margin={"l": 10, "r": 10, "t": 90, "b": 40},
    )
    return fig


def _pid(e: dict[str, Any]) -> int:
    return PREDICTED_PID if e["rank"] < 0 else int(e["rank"])


def _hover(e: dict[str, Any]) -> str:
    a = e.get("args", {})
    bits = [f"<b>{e['name']}</b>", f"step {e['step']}", f"{(e['end'] - e['start']) * 1e3:.3f} ms"]
    if a.get("bytes"):
        bits.append(f"{a['bytes'] / 1e6:.3f} MB")
    if a.get("peers") is not None:
        bits.append(f"peers {a['peers']}")
    if a.get("variables"):
        bits.append("variables " + ", ".join(a["variables"]))
    return "<br>".join(bits)
