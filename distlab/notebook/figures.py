"""How distlab's figures look and travel in a notebook.

- ``THEME``: plotly's white template on transparent backgrounds, with mid-grey text and grid
  lines, so a chart reads on JupyterLab's light and dark themes alike.
- ``figure_bundle(fig)``: the figure as output data, its plotly JSON only. JupyterLab's plotly
  extension renders it offline; ``distlab.notebook.execute.export_html`` embeds plotly.js once per
  HTML page. No copy of plotly.js lands in the saved notebook (plotly's own notebook renderer
  and every ``FigureWidget``, an anywidget, carry one each: 5 MB).
- ``FigureView``: a figure shown in an ipywidgets ``Output`` as that bundle, redrawn by
  ``show()``; widgets (the picker) use it instead of a ``FigureWidget``, so their saved state
  holds the figure's JSON, not plotly.js.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

PLOTLY_MIME = "application/vnd.plotly.v1+json"
GREY = "#808080"
GRID = "rgba(128,128,128,0.25)"
_axis = {"gridcolor": GRID, "zerolinecolor": GRID, "linecolor": GRID, "title": {"font": {"color": GREY}}}
THEME = go.layout.Template(pio.templates["plotly_white"])
THEME.layout.update(
    paper_bgcolor="rgba(0,0,0,0)",
    plot_bgcolor="rgba(0,0,0,0)",
    font={"color": GREY},
    xaxis=_axis,
    yaxis=_axis,
    legend={"bgcolor": "rgba(0,0,0,0)"},
)


def figure_bundle(fig: Any, themed: bool = False) -> dict[str, Any]:
    """``fig`` as display data: its plotly JSON and a line of text (see the module's docstring);
    ``themed``: with ``THEME`` set in the JSON (a figure built without it, for speed)."""
    data = json.loads(pio.to_json(fig, validate=False))
    if themed:
        data.setdefault("layout", {})["template"] = _theme_json()
    data.setdefault("config", {})["displaylogo"] = False
    title = getattr(getattr(fig.layout, "title", None), "text", None)
    return {PLOTLY_MIME: data, "text/plain": f"<plotly figure{': ' + title if title else ''}>"}


@functools.cache
def _theme_json() -> dict[str, Any]:
    return json.loads(pio.to_json(go.Figure(layout={"template": THEME}), validate=False))["layout"][
        "template"
    ]


class Figure(go.Figure):
    """A ``go.Figure`` that a notebook shows as ``figure_bundle`` (its JSON, no plotly.js): what
    ``dl.plot``, ``run.plot()`` and the views return. Everything else is plotly's."""

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None, **kwargs: Any) -> dict[str, Any]:
        return figure_bundle(self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(figure_bundle(self), raw=True)


def themed(fig: Any) -> Figure:
    """``fig`` (a figure or ``make_subplots``' result) as a ``Figure`` in ``THEME``."""
    out = Figure(fig)
    out.update_layout(template=THEME)
    return out


class FigureView:
    """``figure`` (a ``go.Figure``) in an ``ipywidgets.Output`` (``widget``); ``show()`` redraws it.

    Safe from any thread: it sets the Output's outputs rather than capturing a display."""

    def __init__(self, figure: Any) -> None:
        import ipywidgets as w

        self.figure = figure
        self.widget = w.Output(layout=w.Layout(width="100%"))
        self.show()

    def show(self) -> None:
        self.widget.outputs = (
            {"output_type": "display_data", "data": figure_bundle(self.figure), "metadata": {}},
        )
