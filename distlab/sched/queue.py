"""``lab.queue``: a shared Lab's runs with their workers, state and goodput, and their allocations over time.

Columns of ``frame()``: ``run``, ``model``, ``state`` (queued, running, paused, waiting (paused),
finished, failed, cancelled), ``workers`` (how many it holds now), ``allocation`` (their
addresses), ``range`` (the ``min..max`` workers it asked for), ``goodput`` (samples/s of its latest
segment; an adaptive run's own goodput, throughput times statistical efficiency), ``steps_done``,
``restarts`` (allocation changes after its start), ``waited_s`` (seconds from submission to start),
``jct_s`` (submission to end, once ended), ``strategy`` (what it trains under now: a run launched
with ``strategy="auto"`` is re-chosen per allocation), ``speedup`` (what the scheduler priced its
allocations with: ``linear``, ``measured``, ``cost model`` or ``cost model + measured``) and
``restart_s`` (the seconds the scheduler last priced one restart of it at: its checkpoint's bytes at
the measured storage rate plus its measured relaunch; sched/lab_pricing.py).
"""

from __future__ import annotations

import html
import time
from typing import Any

QUEUE_COLUMNS = (
    "run",
    "model",
    "state",
    "workers",
    "allocation",
    "range",
    "goodput",
    "steps_done",
    "restarts",
    "waited_s",
    "jct_s",
    "strategy",
    "speedup",
    "restart_s",
)


def latest_goodput(run: Any) -> float:
    """An adaptive run's last reported goodput, else samples/s over its latest segment."""
    from distlab.sched.lab_pricing import segment_throughputs

    m = run.metrics
    if len(m) and "goodput" in m and m["goodput"].notna().any():
        return float(m["goodput"].dropna().iloc[-1])
    if len(m) == 0:
        return float("nan")
    last = m[m["restart"] == m["restart"].max()]
    tp = segment_throughputs(last)
    return next(iter(tp.values())) if tp else float("nan")


class LabQueue:
    """The runs of a Lab (``lab.queue``): a table in a notebook, ``frame()`` as a DataFrame,
    ``plot()`` as one lane per worker."""

    def __init__(self, scheduler: Any, runs: list[Any]) -> None:
        self._scheduler = scheduler
        self._runs = runs

    def frame(self) -> Any:
        """One row per run, oldest first (module docstring: the columns)."""
        import pandas as pd

        rows = []
        for run in self._runs:
            job = self._scheduler.job_of(run) if self._scheduler is not None else None
            # a run that ended holds none, though the round that frees its workers may not have run yet
            workers = () if run.done else tuple(job.workers) if job is not None else tuple(run.workers)
            state = job.state if job is not None else run.status
            waited = jct = float("nan")
            if job is not None:
                if job.started is not None:
                    waited = job.started - job.submitted
                jct = (job.ended - job.submitted) if job.ended is not None else float("nan")
                span = f"{job.min_workers}..{job.max_workers}"
            else:
                span = str(run.world)
            rows.append(
                {
                    "run": run.id,
                    "model": run.model_name,
                    "state": state,
                    "workers": len(workers),
                    "allocation": ", ".join(workers),
                    "range": span,
                    "goodput": latest_goodput(run),
                    "steps_done": run.steps_done,
                    "restarts": run.restarts,
                    "waited_s": waited,
                    "jct_s": jct,
                    "strategy": run.strategy.name + (" (auto)" if job is not None and job.chooses else ""),
                    "speedup": job.speedup_basis if job is not None else "",
                    "restart_s": job.restart_cost if job is not None else float("nan"),
                }
            )
        return pd.DataFrame(rows, columns=list(QUEUE_COLUMNS))

    @property
    def notes(self) -> list[str]:
        """What the scheduler refused and why (a policy's bad allocation, a run it could not resize),
        and each change of strategy it made (a run launched with ``strategy="auto"``)."""
        return list(self._scheduler.notes) if self._scheduler is not None else []

    def plot(self, runs: Any = None) -> Any:
        """Plotly: one lane per worker, a bar for each stretch a run held it (seconds since the Lab's
        scheduler started); the runs in their own colours. ``runs``: only these (Runs or ids)."""
        return allocation_figure(self.intervals(runs), self._worker_names())

    def intervals(self, runs: Any = None) -> list[dict[str, Any]]:
        """Each stretch a run held a worker: ``{"worker", "run", "start", "end"}`` (seconds), of
        every run or only ``runs`` (Runs or their ids)."""
        keep = None if runs is None else {getattr(r, "id", r) for r in runs}
        if self._scheduler is None:
            return []
        now = time.monotonic() - self._scheduler.t0
        held: dict[tuple[str, str], float] = {}
        out: list[dict[str, Any]] = []
        for ev in list(self._scheduler.events):
            mine = {w for (r, w) in held if r == ev["run"]}
            for w in mine - set(ev["workers"]):
                out.append(
                    {"worker": w, "run": ev["run"], "start": held.pop((ev["run"], w)), "end": ev["time"]}
                )
            for w in set(ev["workers"]) - mine:
                held[(ev["run"], w)] = ev["time"]
        out += [{"worker": w, "run": r, "start": t, "end": now} for (r, w), t in held.items()]
        out = [i for i in out if keep is None or i["run"] in keep]
        return sorted(out, key=lambda i: (i["start"], i["worker"]))

    def _worker_names(self) -> list[str]:
        if self._scheduler is None:
            return []
        try:
            return list(self._scheduler.cluster.resources.addresses)
        except Exception:  # noqa: BLE001 - a closed Lab still draws the workers its runs held
            return sorted({i["worker"] for i in self.intervals()})

    def __len__(self) -> int:
        return len(self._runs)

    def __repr__(self) -> str:
        return self.frame().to_string(index=False) if self._runs else "<lab.queue: no runs>"

    def _repr_html_(self) -> str:
        frame = self.frame()
        policy = type(self._scheduler.policy).__name__ if self._scheduler is not None else "one run at a time"
        head = f"<p><b>lab.queue</b>: {len(frame)} runs; scheduler: {html.escape(policy)}</p>"
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes[-5:])
        return (
            head
            + frame.to_html(index=False, na_rep="", float_format=lambda x: f"{x:.3g}")
            + (f"<p>Scheduler notes (newest last):</p><ul>{notes}</ul>" if notes else "")
        )


def allocation_figure(intervals: list[dict[str, Any]], workers: list[str]) -> Any:
    """Plotly: a horizontal bar per ``interval`` on its worker's lane, coloured by run."""
    import plotly.graph_objects as go

    lanes = list(workers) + sorted({i["worker"] for i in intervals} - set(workers))
    fig = go.Figure()
    for run in dict.fromkeys(i["run"] for i in intervals):
        mine = [i for i in intervals if i["run"] == run]
        fig.add_trace(
            go.Bar(
                name=run,
                y=[i["worker"] for i in mine],
                x=[i["end"] - i["start"] for i in mine],
                base=[i["start"] for i in mine],
                orientation="h",
                hovertemplate=f"{run}: %{{base:.1f}} s + %{{x:.1f}} s on %{{y}}<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="overlay",
        title="Allocations over time (one lane per worker)",
        xaxis_title="seconds since the scheduler started",
        yaxis={"categoryorder": "array", "categoryarray": lanes, "title": "worker"},
        height=160 + 40 * len(lanes),
    )
    return fig
