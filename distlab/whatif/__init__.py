"""What if, from the run itself: a traced run's step graph replayed with one thing changed (a
link, the world, the hosts, the buckets, overlap, the device, the strategy), beside the analytic
model (Daydream, dPRO and Lumos replay traces so; see docs/whatif.md).

``run.whatif(bandwidth=..., world=..., strategy=...)`` on a run launched with ``trace=True``;
``dl.whatif.load("trace.json").whatif(...)`` on a trace ``run.save_trace`` wrote, here or on a
bigger cluster. ``trace`` reads it, ``graph`` builds the step graph, ``replay`` schedules it,
``transform`` and ``swap`` change it (``pricing`` costs the nodes they build), ``result`` is what a
user holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distlab.whatif.result import Trace, WhatIf
from distlab.whatif.trace import TraceError, load_chrome
from distlab.whatif.trace import from_run as _data_of_run

__all__ = ["Trace", "TraceError", "WhatIf", "load", "of_run", "replay_clause"]


def load(path: str | Path, cost_model: Any = None, resources: Any = None, profile: Any = None) -> Trace:
    """A saved Chrome trace (``run.save_trace(path)``) as a ``Trace`` to replay; ``cost_model``
    prices what the what-ifs change (default: ``CostModel.default()``)."""
    return Trace(load_chrome(path), cost_model, resources, profile)


def of_run(run: Any, cost_model: Any = None) -> Trace:
    """A traced run as a ``Trace``, with the model's profile and resources the Lab predicted it with."""
    f = run.forecast
    return Trace(
        _data_of_run(run),
        cost_model if cost_model is not None else getattr(f, "cost_model", None),
        f.resources if f is not None else None,
        f.profile if f is not None else None,
    )


def replay_clause(
    trace: Any, cost_model: Any, strategy: Any, res: Any, prediction: Any, link: Any
) -> tuple[Trace, str]:
    """The strategy picker's plan-line clause: ``trace`` (a traced Run or a ``Trace``) replayed with
    ``strategy`` on ``res`` (its hosts; ``link``: the what-if's inter-host ``Link`` or None) beside
    ``prediction``; returns the ``Trace`` (built once from a Run) and the HTML clause ("" without one)."""
    import html

    from distlab.errors import DistlabError

    if trace is None:
        return trace, ""
    if not isinstance(trace, Trace):
        trace = of_run(trace, cost_model)
    across = link is not None and res.num_hosts > 1
    try:
        w = trace.whatif(
            strategy=strategy,
            hosts=res.num_hosts if res.num_hosts != trace.graph.num_hosts else None,
            bandwidth=link.bandwidth if across else None,
            latency=link.latency if across else None,
        )
    except DistlabError as e:
        # the replay does not apply (a stale or asynchronous PS from a synchronous trace, ...):
        # say so beside the analytic figure instead of showing a figure priced another way
        return trace, (
            f"<br><span style='color:#888'>replay does not apply; the figure above is the analytic "
            f"model's: {html.escape(str(e))}</span>"
        )
    return trace, (
        f"<br>{html.escape(trace.data.source)} replayed with this plan: {w.throughput:,.0f} samples/s, "
        f"step {w.step_time * 1e3:,.1f} ms; {html.escape(w.versus(prediction))}{html.escape(_paces(w))}"
    )


def _paces(w: WhatIf) -> str:
    """A note when the replayed ranks run at their own paces (asynchronous gossip or PS): the
    replay's step is the slowest rank's, an analytic consistency figure every rank's mean."""
    paces = w.replayed.rank_step_times
    if not len(paces) or paces.max() <= 1.05 * paces.min():
        return ""
    return (
        f" (ranks at their own paces, {paces.min() * 1e3:,.1f}-{paces.max() * 1e3:,.1f} ms a step: the "
        "replay's step is the slowest rank's, the analytic figure of an asynchronous plan every rank's mean)"
    )
