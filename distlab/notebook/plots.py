"""Plotly figures for the cost model (``dl.plot``): predicted vs measured, step breakdown, predicted scaling.

Every function returns a ``plotly.graph_objects.Figure``; outside a notebook save it with
``fig.write_html("plot.html")``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from distlab.errors import DistlabError
from distlab.notebook.figures import THEME, Figure

PARTS = ("compute", "comm", "optimizer")
PART_LABELS = {"compute": "compute", "comm": "exposed communication", "optimizer": "optimizer"}
PART_COLOURS = {"compute": "#4c78a8", "comm": "#e45756", "optimizer": "#72b7b2"}
RUNS_COLUMNS = (
    "strategy",
    "predicted_throughput",
    "measured_throughput",
)  # plus optional world, batch, model


def predicted_vs_measured(runs: pd.DataFrame, band: float = 0.10) -> go.Figure:
    """Log-log scatter of predicted against measured throughput (samples/s), one colour per strategy.

    ``runs`` columns: ``strategy``, ``predicted_throughput``, ``measured_throughput`` (required);
    ``world``, ``batch``, ``model`` (optional, shown on hover). Rows without a measurement yet
    are left out. Adds the y = x line and a +/-``band`` band around it.
    """
    df = pd.DataFrame(runs)
    missing = [c for c in RUNS_COLUMNS if c not in df.columns]
    if missing:
        raise DistlabError(
            f"runs: missing columns {missing}; predicted_vs_measured needs {list(RUNS_COLUMNS)}"
        )
    df = df.dropna(subset=["predicted_throughput", "measured_throughput"])
    df = df[(df["predicted_throughput"] > 0) & (df["measured_throughput"] > 0)]
    fig = Figure()
    if len(df):
        lo = float(min(df["predicted_throughput"].min(), df["measured_throughput"].min())) / 1.3
        hi = float(max(df["predicted_throughput"].max(), df["measured_throughput"].max())) * 1.3
    else:
        lo, hi = 1.0, 10.0
    xs = np.geomspace(lo, hi, 50)
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=xs * (1 + band),
            mode="lines",
            line={"width": 0},
            showlegend=False,
            hoverinfo="skip",
            name=f"+{band:.0%}",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=xs,
            y=xs * (1 - band),
            mode="lines",
            line={"width": 0},
            fill="tonexty",
            fillcolor="rgba(128,128,128,0.2)",
            name=f"±{band:.0%}",
            hoverinfo="skip",
        )
    )
    fig.add_trace(go.Scatter(x=xs, y=xs, mode="lines", line={"color": "grey", "dash": "dash"}, name="y = x"))
    extra = [c for c in ("model", "world", "batch") if c in df.columns]
    for name, g in df.groupby("strategy", sort=True):
        err = g["predicted_throughput"] / g["measured_throughput"] - 1
        text = [
            "<br>".join([f"strategy: {name}", *(f"{c}: {row[c]}" for c in extra), f"error: {e:+.1%}"])
            for (_, row), e in zip(g.iterrows(), err)
        ]
        fig.add_trace(
            go.Scatter(
                x=g["measured_throughput"],
                y=g["predicted_throughput"],
                mode="markers",
                name=str(name),
                text=text,
                hovertemplate="%{text}<br>measured %{x:.4g}<br>predicted %{y:.4g}<extra></extra>",
            )
        )
    ticks = log_ticks(lo, hi)
    labels = [f"{t:,.0f}" if t >= 1 else f"{t:g}" for t in ticks]
    fig.update_xaxes(type="log", title="measured throughput (samples/s)", tickvals=ticks, ticktext=labels)
    fig.update_yaxes(type="log", title="predicted throughput (samples/s)", tickvals=ticks, ticktext=labels)
    fig.update_layout(title="Predicted vs measured throughput", template=THEME)
    return fig


def log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks a reader can read on a log axis from ``lo`` to ``hi``: 1, 2 and 5 times the powers of
    ten inside it (plotly's own label the minor ticks by their first digit only: "5, 2, 1000")."""
    out = []
    for exp in range(int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi))) + 1):
        out += [m * 10.0**exp for m in (1, 2, 5) if lo <= m * 10.0**exp <= hi]
    return out or [lo, hi]


def _breakdown_frame(predictions: Any) -> pd.DataFrame:
    if isinstance(predictions, pd.DataFrame):
        missing = [c for c in ("strategy", *PARTS) if c not in predictions.columns]
        if missing:
            raise DistlabError(
                f"predictions: missing columns {missing}; pass CostModel.rank(...) or a list of Predictions"
            )
        return predictions[["strategy", *PARTS]].reset_index(drop=True)
    rows = []
    for i, p in enumerate(predictions):
        if not hasattr(p, "breakdown"):
            raise DistlabError(f"predictions[{i}]: expected a Prediction, got {type(p).__name__}")
        rows.append({"strategy": p.strategy, **{k: p.breakdown[k] for k in PARTS}})
    return pd.DataFrame(rows, columns=["strategy", *PARTS])


def breakdown(predictions: Any, unit: str = "ms") -> go.Figure:
    """Stacked bars of compute / exposed communication / optimizer time per strategy.

    ``predictions``: the DataFrame ``CostModel.rank`` returns, or a list of ``Prediction``.
    Strategies sharing a name get a numbered label so each bar stays its own.
    """
    df = _breakdown_frame(predictions)
    scale = {"ms": 1e3, "s": 1.0, "us": 1e6}[unit]
    from distlab.notebook.ranking import short_label

    labels = [short_label(n) for n in df["strategy"].astype(str)]
    seen: dict[str, int] = {}
    for i, lab in enumerate(labels):
        seen[lab] = seen.get(lab, 0) + 1
        if seen[lab] > 1:
            labels[i] = f"{lab} #{seen[lab]}"
    fig = Figure()
    for part in PARTS:
        fig.add_trace(
            go.Bar(
                x=labels,
                y=df[part].to_numpy() * scale,
                name=PART_LABELS[part],
                marker_color=PART_COLOURS[part],
                hovertemplate=f"%{{x}}<br>{PART_LABELS[part]}: %{{y:.3f}} {unit}<extra></extra>",
            )
        )
    fig.update_layout(
        barmode="stack",
        title="Predicted step time breakdown",
        yaxis_title=f"step time ({unit})",
        template=THEME,
    )
    return fig


def scaling(
    profile: Any, resources_range: Any, strategies: Sequence[Any], cost_model: Any = None
) -> go.Figure:
    """Predicted throughput against world size, one line per strategy.

    ``resources_range``: a list of ``ResourceSpec`` (each strategy is predicted on each; a
    strategy built for another world is resized by the cost model's sweep), or
    ``(ResourceSpec, [world sizes])`` to sweep one cluster shape over world sizes.
    """
    from distlab.costmodel import CostModel

    cm = cost_model or CostModel.default()
    strategies = list(strategies)
    if (
        isinstance(resources_range, tuple)
        and len(resources_range) == 2
        and not hasattr(resources_range[1], "ranks")
    ):
        res, worlds = resources_range
        table = cm.sweep(profile, res, strategies, worlds=list(worlds))
    else:
        frames = [cm.sweep(profile, res, strategies, worlds=[res.world]) for res in resources_range]
        table = (
            pd.concat(frames, ignore_index=True)
            if frames
            else pd.DataFrame(columns=["strategy", "index", "world", "throughput"])
        )
    fig = Figure()
    for _, g in table.groupby("index", sort=True):
        g = g.sort_values("world")
        fig.add_trace(
            go.Scatter(
                x=g["world"],
                y=g["throughput"],
                mode="lines+markers",
                name=str(g["strategy"].iloc[0]),
                hovertemplate="world %{x}<br>%{y:.4g} samples/s<extra></extra>",
            )
        )
    fig.update_layout(
        title=f"Predicted scaling of {getattr(profile, 'name', 'model')}",
        xaxis_title="world size (ranks)",
        yaxis_title="predicted throughput (samples/s)",
        template=THEME,
    )
    return fig
