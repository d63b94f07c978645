"""Notebook views of planning results: the profile chart and the ranked-candidates view."""

from __future__ import annotations

import html
from typing import Any


def profile_chart(prof: Any) -> Any:
    """Per-layer time (forward + backward, ms) and GFLOPs side by side, as a plotly figure."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from distlab.notebook.figures import themed

    df = prof.to_frame()
    fig = themed(
        make_subplots(
            rows=1, cols=2, subplot_titles=("time per step (ms)", "GFLOP per step"), horizontal_spacing=0.18
        )
    )
    names = [f"{n} ({k})" for n, k in zip(df["name"], df["kind"])]
    # one colour per pass in both panels, one legend entry each (the FLOPs bars join its group)
    for pass_, colour, t, f in (
        ("forward", "#4c78a8", "time_fwd", "flops_fwd"),
        ("backward", "#f58518", "time_bwd", "flops_bwd"),
    ):
        fig.add_trace(
            go.Bar(
                y=names, x=df[t] * 1e3, name=pass_, legendgroup=pass_, orientation="h", marker_color=colour
            ),
            1,
            1,
        )
        fig.add_trace(
            go.Bar(
                y=names,
                x=df[f] / 1e9,
                name=pass_,
                legendgroup=pass_,
                orientation="h",
                marker_color=colour,
                showlegend=False,
            ),
            1,
            2,
        )
    fig.update_layout(
        barmode="stack",
        title=f"{prof.name}: batch {prof.batch_size}",
        height=max(300, 22 * len(df) + 120),
        yaxis={"autorange": "reversed"},
        yaxis2={"autorange": "reversed", "showticklabels": False},
        margin={"l": 10, "r": 10, "t": 60, "b": 30},
    )
    return fig


def ranking_view(table: Any, top: int = 10) -> list[Any]:
    """What ``%distlab simulate`` shows of a ranking (``notebook.ranking.ranking``): the top
    ``top`` rows as a table with units, its breakdown chart, and the single-process note if any."""
    from distlab.notebook import plots
    from distlab.notebook.ranking import display_table, top_with_baseline

    views = [display_table(table, top), plots.breakdown(top_with_baseline(table, top))]
    note = table.attrs.get("note")
    if note:
        from IPython.display import HTML

        views.insert(0, HTML(f"<p><b>distlab</b>: {html.escape(note)}</p>"))
    return views


def runs_table(runs: Any) -> Any:
    """``lab.runs`` as a person reads it: samples/s as integers, no internal columns or index."""
    import pandas as pd

    def rate(col: str) -> Any:
        return runs[col].map(lambda v: f"{v:,.0f}" if v == v else "-")

    out = pd.DataFrame(
        {
            "run": runs["run_id"],
            "model": runs["model"],
            "strategy": runs["strategy"],
            "workers": runs["world"],
            "batch": runs["batch"],
            "steps": runs["steps"],
            "status": runs["status"],
            "measured (samples/s)": rate("measured_throughput"),
            "predicted (samples/s)": rate("predicted_throughput"),
            "refitted (samples/s)": rate("refitted_throughput"),
        }
    )
    if "prediction_basis" in runs:  # what each prediction's compute came from
        out["predicted from"] = runs["prediction_basis"].map(lambda v: v if isinstance(v, str) else "-")
    return Table(out)


class Table:
    """A table for people: HTML without the index in a notebook, aligned text in a terminal;
    ``.frame`` is the DataFrame."""

    def __init__(self, frame: Any) -> None:
        self.frame = frame

    def _repr_html_(self) -> str:
        return self.frame.style.hide(axis="index").format(precision=1, thousands=",").to_html()

    def __repr__(self) -> str:
        return self.frame.to_string(index=False)
