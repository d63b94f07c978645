"""The picker's two charts, as plain figures (notebook/figures.py shows them): the plan chart
(the selected strategy's step and the ranking's, as stacked milliseconds, and the selected
strategy's throughput over hosts like this one) and the measured-against-predicted chart,
which says what it is for until the first Launch."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from distlab.notebook.figures import THEME, Figure, themed

PARTS = (("compute", "#4c78a8"), ("comm", "#f58518"), ("optimizer", "#54a24b"))
PART_NAMES = {"compute": "compute", "comm": "exposed communication", "optimizer": "optimizer"}
HOSTS = (1, 2, 4, 8, 16, 32, 64)  # the scaling chart's hosts (plus the what-if's own)
EMPTY_RUNS = {
    "text": "Launch a strategy: its measured throughput appears here against the Lab's prediction",
    "xref": "paper",
    "yref": "paper",
    "x": 0.5,
    "y": 0.5,
    "showarrow": False,
}


def plan_figure() -> Figure:
    fig = themed(
        make_subplots(
            rows=1,
            cols=2,
            column_widths=[0.58, 0.42],
            horizontal_spacing=0.12,
            subplot_titles=(
                "step time of the selected and the best strategies (ms)",
                "scaling over hosts like this one",
            ),
        )
    )
    fig.update_layout(
        template=THEME,
        height=400,
        barmode="stack",
        margin={"l": 10, "r": 10, "t": 80, "b": 70},
        legend={"orientation": "h", "x": 0, "y": 1.2, "yanchor": "bottom"},
    )
    for part, colour in PARTS:
        fig.add_bar(
            x=[],
            y=[],
            name=PART_NAMES[part],
            marker_color=colour,
            orientation="h",
            row=1,
            col=1,
            hovertemplate="%{y}<br>" + PART_NAMES[part] + " %{x:,.2f} ms<extra></extra>",
        )
    fig.add_scatter(
        x=[],
        y=[],
        mode="lines+markers",
        name="selected, predicted",
        row=1,
        col=2,
        line={"color": "#4c78a8"},
        hovertemplate="%{x} hosts<br>%{y:,.0f} samples/s<extra></extra>",
    )
    fig.update_xaxes(title_text="ms per step", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(autorange="reversed", automargin=True, row=1, col=1)
    fig.update_xaxes(title_text="hosts", type="log", row=1, col=2)
    fig.update_yaxes(title_text="samples/s", rangemode="tozero", row=1, col=2)
    return fig


def draw_plan(
    fig: go.Figure,
    rows: list[tuple[str, dict[str, float]]],
    hosts: list[int],
    curve: list[Any],
    here: int,
    bottleneck: str = "",
) -> None:
    """Bars: ``rows`` (label, breakdown in seconds) in ms; the curve of throughput over ``hosts``,
    the what-if's own ``here`` marked; under them, the host link that bounds the selected strategy's
    step (its prediction's ``bottleneck:`` note), if one does."""
    with fig.batch_update():
        fig.update_layout(title={"text": bottleneck, "font": {"size": 12}, "x": 0.01, "y": 0.02})
        for trace, (part, _) in zip(fig.data[:3], PARTS):
            trace.y = [label for label, _ in rows]
            trace.x = [b[part] * 1e3 for _, b in rows]
        fig.data[3].x = hosts
        fig.data[3].y = curve
        fig.data[3].marker = {"size": [11 if h == here else 6 for h in hosts]}
        fig.update_xaxes(tickvals=hosts, ticktext=[str(h) for h in hosts], row=1, col=2)


def measured_figure() -> Figure:
    fig = Figure()
    fig.add_scatter(
        x=[],
        y=[],
        mode="markers+text",
        name="runs",
        textposition="top center",
        hovertemplate="%{text}<br>predicted %{x:,.0f}<br>measured %{y:,.0f} samples/s<extra></extra>",
    )
    fig.update_layout(
        template=THEME,
        title="measured against the Lab's prediction (samples/s)",
        height=320,
        xaxis={"title": "predicted", "visible": False},
        yaxis={"title": "measured", "visible": False},
        annotations=[EMPTY_RUNS],
        margin={"l": 10, "r": 10, "t": 50, "b": 40},
    )
    return fig


def draw_measured(fig: go.Figure, runs: list[dict[str, Any]], labels: list[str]) -> None:
    """One point per run against its prediction, on the y = x line; axes appear with the first run."""
    xs = [r["predicted_throughput"] for r in runs]
    ys = [r["measured_throughput"] for r in runs]
    hi = max(xs + ys) * 1.15 if runs else 1.0
    with fig.batch_update():
        fig.data[0].x, fig.data[0].y = xs, ys
        fig.data[0].text = labels
        if len(fig.data) < 2:
            fig.add_scatter(
                x=[0, hi],
                y=[0, hi],
                mode="lines",
                name="y = x",
                line={"color": "#808080", "dash": "dash"},
                hoverinfo="skip",
            )
        fig.data[1].x = fig.data[1].y = [0, hi]
        fig.layout.annotations = ()
        fig.update_layout(
            xaxis={"visible": True, "range": [0, hi]}, yaxis={"visible": True, "range": [0, hi]}
        )
