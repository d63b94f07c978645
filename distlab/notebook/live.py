"""A run as a figure: loss, throughput against its prediction, each rank's step time and, for an
adaptive run, its batch, noise scale and goodput; drawn live while the run trains.

``run_figure(run)`` draws the run's records so far as a static plotly figure (``run.plot()``).
``LiveView`` shows that figure in the notebook and redraws it from a thread of its own until the
run ends, through an IPython display id: the output it updates keeps updating after the cell that
launched the run has returned, holds plain figure JSON (no widget state), and the saved notebook
and a papermill output keep the final figure.

However long the run, the view stays light: the card (status, steps done, loss) follows the run
every ``interval`` seconds, and the figure, whose every redraw costs the browser about 0.2 s of
a core however few its points (plotly lays the whole figure out again), every
``FIGURE_INTERVAL`` seconds; every trace is thinned to ``MAX_POINTS`` points, a redraw builds
the frame only from the records that arrived since the last (``run.metrics`` is incremental),
redraws are spaced so they take at most ``DRAW_SHARE`` of a core from the ranks, and the
browser re-renders the saved outputs only every ``DISPLAY_EVERY`` figures. The last step and
the run's end are drawn at once. Measured by ``distlab bench live-view`` (a real JupyterLab and
Chromium).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

MAX_POINTS = 500  # steps drawn per trace: a long run is thinned evenly, its last step kept
POLL = 0.1  # seconds: how soon the view sees steps arrive and the run end
DRAW_SHARE = 0.1  # the most of a core the view's redraws take from the run (the ranks need them)
FIGURE_INTERVAL = 5.0  # seconds between redraws of the figure (the card follows every ``interval``)
DISPLAY_EVERY = 10  # figures drawn between updates of the saved (display id) outputs
SMOOTH = 9  # steps in the rolling median drawn over the per-step throughput
RANK_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d")
ADAPTIVE_COLUMNS = ("global_batch", "noise_scale", "goodput")


def per_step(metrics: Any) -> Any:
    """One row per step (the latest restart's where steps were re-run): mean loss, global samples,
    duration (the slowest rank's wall-clock interval), throughput, and the adaptive columns."""
    import pandas as pd

    if metrics is None or len(metrics) == 0:
        return pd.DataFrame(columns=["step", "loss", "samples", "duration", "throughput"])
    m = metrics.sort_values(["restart", "rank", "step"])
    by_rank = m.groupby(["restart", "rank"])
    m = m.assign(duration=by_rank["wall_time"].diff(), gsamples=by_rank["samples"].diff())
    agg = {"loss": ("loss", "mean"), "samples": ("gsamples", "max"), "duration": ("duration", "max")}
    for c in (*ADAPTIVE_COLUMNS, "per_replica"):
        if c in m.columns:
            agg[c] = (c, "first")
    steps = m.groupby(["restart", "step"]).agg(**agg).reset_index()
    steps = steps.sort_values(["step", "restart"]).drop_duplicates("step", keep="last")
    steps["throughput"] = steps["samples"] / steps["duration"]
    return steps.reset_index(drop=True)


def _thin(df: Any) -> Any:
    if len(df) <= MAX_POINTS:
        return df
    k = math.ceil(len(df) / MAX_POINTS)
    keep = list(range(0, len(df), k))
    if keep[-1] != len(df) - 1:
        keep.append(len(df) - 1)
    return df.iloc[keep]


def run_figure(run: Any, themed: bool = True) -> Any:
    """The run's records so far as a plotly figure (see the module's docstring); ``themed=False``
    leaves distlab's theme out (a live redraw adds it to the JSON: validating the theme was most
    of a redraw's cost)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from distlab.notebook.figures import themed as in_theme

    metrics = run.metrics
    steps = _thin(per_step(metrics))
    adaptive = all(c in metrics.columns for c in ADAPTIVE_COLUMNS)
    titles = ["loss", "throughput (samples/s)", "step time per rank (ms)"]
    if adaptive:
        titles += ["global batch (samples)", "noise scale φ (samples)", "goodput (samples/s)"]
    rows = 3 if adaptive else 2
    # a fixed batch: the per-rank step times take the whole second row
    specs = [[{}, {}], [{}, {}], [{}, {}]] if adaptive else [[{}, {}], [{"colspan": 2}, None]]
    fig = make_subplots(
        rows=rows,
        cols=2,
        specs=specs,
        subplot_titles=titles,
        vertical_spacing=0.16 if rows == 2 else 0.11,
        horizontal_spacing=0.1,
    )
    x = steps["step"] + 1
    fig.add_trace(go.Scatter(x=x, y=steps["loss"], mode="lines", name="loss", showlegend=False), 1, 1)
    _add_throughput(fig, x, steps["throughput"], _predicted(run, steps))
    _add_rank_steps(fig, metrics)
    if adaptive:
        for (row, col), c, colour in (
            ((2, 2), "global_batch", "#54a24b"),
            ((3, 1), "noise_scale", "#b279a2"),
            ((3, 2), "goodput", "#f58518"),
        ):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=steps[c],
                    mode="lines",
                    name=c,
                    showlegend=False,
                    line={"color": colour, "shape": "hv" if c == "global_batch" else "linear"},
                ),
                row,
                col,
            )
    for r in range(1, rows + 1):
        for c in (1, 2) if adaptive or r == 1 else (1,):
            fig.update_xaxes(title_text="step" if r == rows else None, row=r, col=c)
    fig.update_yaxes(rangemode="tozero", row=1, col=2)
    done = f"{int(steps['step'].max()) + 1 if len(steps) else 0}{f'/{run.steps}' if run.steps else ''} steps"
    fig.update_layout(
        title={
            "text": f"run {run.id}: {run.strategy.name}, {run.status} ({done})",
            "x": 0.01,
            "font": {"size": 14},
        },
        height=300 * rows,
        margin={"l": 50, "r": 20, "t": 70, "b": 80},
        # below the plots: plotly's toolbar sits at the top right and covered a legend there
        legend={"orientation": "h", "yanchor": "top", "y": -0.25 / rows, "xanchor": "left", "x": 0.0},
    )
    if not len(steps):
        fig.add_annotation(
            text="waiting for the first step ...", xref="paper", yref="paper", x=0.5, y=0.5, showarrow=False
        )
    return in_theme(fig) if themed else fig


def _predicted(run: Any, steps: Any) -> Any:
    """The Lab's prediction per step: one value for a fixed batch, the prediction of each step's
    configuration for an adaptive run (None without a prediction)."""
    table = getattr(run, "step_table", None)
    if table and "global_batch" in steps and len(steps):
        per_replica = steps.get("per_replica")
        out = []
        for i, m in enumerate(steps["global_batch"]):
            b = (
                int(per_replica.iloc[i])
                if per_replica is not None and per_replica.iloc[i] == per_replica.iloc[i]
                else None
            )
            k = int(m) // (b * run.world) if b else None
            seconds = table.get((b, k))
            out.append(m / seconds if seconds else math.nan)
        return out
    p = float(run.predicted_throughput)
    if not math.isfinite(p) or not len(steps):
        return None
    return [p] * len(steps)


class LiveView:
    """``run``'s card and figure in the notebook, redrawn as steps arrive (the card at most every
    ``interval`` seconds, the figure every ``FIGURE_INTERVAL``; see ``_loop``) until the run ends,
    then once more, final. ``join()`` waits for that last drawing.

    Each of the two outputs is a widget (an ``HTML`` card, an ``Output`` holding the figure's
    JSON) and, in the same output, the card's HTML or the figure's JSON under a display id. A
    redraw sets the widgets, whose messages reach JupyterLab from this thread after the cell has
    returned (JupyterLab drops display updates that arrive for a finished cell), and at the end
    (and every ``DISPLAY_EVERY`` figures) updates the display ids, which papermill applies: the
    saved notebook holds the final figure as plotly JSON, readable without widgets, and the
    widgets' saved state draws the same."""

    def __init__(self, run: Any, interval: float = 0.5) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.display import display

        if not InteractiveShell.initialized():
            from distlab.errors import DistlabError

            raise DistlabError(
                f"run {run.id}: live() draws in a notebook (an IPython shell); here use run.wait() "
                "and run.plot().write_html('run.html')"
            )
        import ipywidgets as w

        self.run, self.interval = run, float(interval)
        card, fig = self._bundles()
        self.card_widget = w.HTML(card["text/html"])
        self.figure_widget = w.Output(layout=w.Layout(width="100%"))
        self.figure_widget.outputs = ({"output_type": "display_data", "data": fig, "metadata": {}},)
        self.card = display(self._with_view(self.card_widget, card), raw=True, display_id=True)
        self.figure = display(self._with_view(self.figure_widget, fig), raw=True, display_id=True)
        self.drawn = 1
        self.error: BaseException | None = None  # the last redraw's error, if one failed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"distlab-live-{run.id}", daemon=True)
        self._thread.start()

    def _bundles(self) -> tuple[dict[str, Any], dict[str, Any]]:
        from distlab.notebook.figures import figure_bundle

        text = {"text/html": self.run._repr_html_(), "text/plain": repr(self.run)}
        return text, figure_bundle(run_figure(self.run, themed=False), themed=True)

    @staticmethod
    def _with_view(widget: Any, data: dict[str, Any]) -> dict[str, Any]:
        view = {"version_major": 2, "version_minor": 0, "model_id": widget.model_id}
        return {"application/vnd.jupyter.widget-view+json": view, **data}

    def _draw(self, final: bool = True, figure: bool = True) -> None:
        """Set the card's widget and (``figure``) the figure's; the display ids too at the end and
        every ``DISPLAY_EVERY`` figures (each update of a display id re-renders its output in the
        browser from scratch)."""
        if not figure:
            self.card_widget.value = self.run._repr_html_()
            return
        card, fig = self._bundles()
        assert card is not None
        self.card_widget.value = card["text/html"]
        self.figure_widget.outputs = ({"output_type": "display_data", "data": fig, "metadata": {}},)
        if final or self.drawn % DISPLAY_EVERY == 0:
            self.card.update(self._with_view(self.card_widget, card), raw=True)
            self.figure.update(self._with_view(self.figure_widget, fig), raw=True)
        self.drawn += 1

    def _loop(self) -> None:
        """Redraw when steps arrived: the card at most every ``interval`` seconds, the figure at
        most every ``FIGURE_INTERVAL``, and never more than ``DRAW_SHARE`` of a core (a redraw
        that took t seconds waits t / DRAW_SHARE); the last step and the run's end within
        ``POLL`` seconds of arriving."""
        seen, now = self.run.steps_done, time.monotonic()
        card_due, figure_due = now + self.interval, now + FIGURE_INTERVAL
        while not self.run.done and not self._stop.is_set():
            self._stop.wait(POLL)
            now, done = time.monotonic(), self.run.steps_done
            last = bool(self.run.steps) and done >= self.run.steps  # drawn at once: the run's end is near
            figure = last or now >= figure_due
            if self.run.done or done == seen or not (figure or now >= card_due):
                continue
            seen = done
            self._try_draw(final=False, figure=figure)
            spent = (time.monotonic() - now) / DRAW_SHARE
            card_due = time.monotonic() + max(self.interval, spent)
            if figure:
                figure_due = time.monotonic() + max(FIGURE_INTERVAL, spent)
        self._try_draw(final=True)  # the figure the saved notebook keeps

    def _try_draw(self, final: bool = True, figure: bool = True) -> None:
        try:
            self._draw(final, figure)
        except Exception as exc:  # noqa: BLE001 - a failed redraw must not end the view; the next may work
            self.error = exc

    def join(self, timeout: float | None = 30.0) -> LiveView:
        self._thread.join(timeout)
        return self

    def finish(self, timeout: float | None = 30.0) -> LiveView:
        """``join``, then the final drawing once more from the calling cell (``run.wait()``'s): when
        the run ended between two cells, the thread's final drawing went out under the id of a cell
        that had finished, which papermill no longer reads, and the saved notebook kept the view's
        first drawing ("pending (0/6 steps)": a whole-suite run of the quickstart, 2026-11-29)."""
        self.join(timeout)
        if self.run.done:
            self._try_draw(final=True)
        return self

    def stop(self) -> None:
        """Stop redrawing (the figure stays as last drawn)."""
        self._stop.set()


def _add_throughput(fig: Any, x: Any, tp: Any, predicted: Any) -> None:
    """Each step's throughput, its running median and the prediction (row 1, column 2)."""
    import plotly.graph_objects as go

    fig.add_trace(
        go.Scatter(
            x=x,
            y=tp,
            mode="lines",
            name="each step",
            line={"color": "#c6d4e6", "width": 1},
            legendgroup="tp",
            showlegend=False,
            hovertemplate="step %{x}<br>%{y:,.0f} samples/s<extra></extra>",
        ),
        1,
        2,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=tp.rolling(SMOOTH, min_periods=1).median(),
            mode="lines",
            name="measured",
            line={"color": "#4c78a8"},
            hovertemplate="step %{x}<br>median %{y:,.0f} samples/s<extra></extra>",
        ),
        1,
        2,
    )
    if predicted is not None:
        fig.add_trace(
            go.Scatter(
                x=x,
                y=predicted,
                mode="lines",
                name="predicted",
                line={"color": "#e45756", "dash": "dash"},
                hovertemplate="step %{x}<br>predicted %{y:,.0f} samples/s<extra></extra>",
            ),
            1,
            2,
        )


def _add_rank_steps(fig: Any, metrics: Any) -> None:
    """Each rank's step times in the latest restart (row 2, column 1), so a straggler shows."""
    import plotly.graph_objects as go

    if len(metrics):
        last = metrics[metrics["restart"] == metrics["restart"].max()]
        for i, (rank, g) in enumerate(last.groupby("rank")):
            g = _thin(g.sort_values("step"))
            fig.add_trace(
                go.Scatter(
                    x=g["step"] + 1,
                    y=g["step_time"] * 1e3,
                    mode="lines",
                    name=f"rank {rank}",
                    line={"color": RANK_COLOURS[i % len(RANK_COLOURS)], "width": 1},
                    hovertemplate=f"rank {rank}<br>step %{{x}}<br>%{{y:.1f}} ms<extra></extra>",
                ),
                2,
                1,
            )
        # the first step (warm-up) and rare stalls would flatten the rest:
        # the axis stops above the 98th percentile
        top = float(last["step_time"].quantile(0.98)) * 1e3 if len(last) else math.nan
        if math.isfinite(top) and top > 0:
            fig.update_yaxes(range=[0, 1.25 * top], row=2, col=1)
