"""Notebook views of planning results: the profile chart and the ranked-candidates view."""

from __future__ import annotations

from typing import Any


def profile_chart(prof: Any) -> Any:
    """Per-layer time (forward + backward, ms) and GFLOPs side by side, as a plotly figure."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = prof.to_frame()
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per step (ms)", "GFLOP per step"), horizontal_spacing=0.18)
    names = [f"{n} ({k})" for n, k in zip(df["name"], df["kind"])]
    fig.add_trace(go.Bar(y=names, x=df["time_fwd"] * 1e3, name="forward", orientation="h", marker_color="#4c78a8"), 1, 1)
    fig.add_trace(go.Bar(y=names, x=df["time_bwd"] * 1e3, name="backward", orientation="h", marker_color="#f58518"), 1, 1)
    fig.add_trace(go.Bar(y=names, x=df["flops_fwd"] / 1e9, name="fwd FLOPs", orientation="h", marker_color="#72b7b2", showlegend=False), 1, 2)
    fig.add_trace(go.Bar(y=names, x=df["flops_bwd"] / 1e9, name="bwd FLOPs", orientation="h", marker_color="#e45756", showlegend=False), 1, 2)
    fig.update_layout(
        barmode="stack",
        title=f"{prof.name}: batch {prof.batch_size}",
        height=max(300, 22 * len(df) + 120),
        yaxis={"autorange": "reversed"},
        yaxis2={"autorange": "reversed", "showticklabels": False},
        margin={"l": 10, "r": 10, "t": 60, "b": 30},
    )
    return fig


def ranking_view(table: Any, top: int = 10) -> tuple[Any, Any]:
    """The top ``top`` rows of a ranking (plain columns only) and its breakdown chart."""
    from distlab.notebook import plots

    head = table.head(top)
    plain = [c for c in head.columns if head[c].map(lambda v: isinstance(v, (str, int, float, bool))).all()]
    return head[plain], plots.breakdown(head)
