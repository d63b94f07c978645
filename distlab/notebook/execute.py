"""Execute notebooks headless with papermill (in the notebook's own kernel) and export them to HTML."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from distlab.errors import DistlabError

ROOT = Path(__file__).resolve().parent.parent.parent
KERNEL = "python3"  # what a notebook runs in when the kernel it names is not installed here
# kernels/distlab: python3 that loads the %distlab extension at start-up (``--ext distlab``)
EXTENSION_KERNEL, EXTENSION_ARGS = "distlab", ["--ext", "distlab"]


def execute_notebook(
    src: str | Path,
    dst: str | Path,
    params: Mapping[str, Any] | None = None,
    *,
    kernel: str | None = None,
    progress: bool = True,
    timeout: int | None = None,
) -> Path:
    """Run ``src`` into ``dst`` with ``params`` injected after its ``parameters`` cell.

    ``kernel``: the kernelspec to run in; by default the one the notebook names in its metadata
    when it is installed here, else ``python3`` (given the ``%distlab`` extension when the
    notebook asked for the distlab kernel, as that kernel would load it).
    """
    import papermill as pm

    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise DistlabError(f"notebook {str(src)!r} does not exist")
    extra: dict[str, Any] = {}
    if kernel is None:
        wanted = notebook_kernel(src)
        kernel = wanted if wanted in installed_kernels() else KERNEL
        if wanted == EXTENSION_KERNEL and kernel != wanted:
            extra["extra_arguments"] = list(EXTENSION_ARGS)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        pm.execute_notebook(
            str(src),
            str(dst),
            parameters=dict(params or {}),
            kernel_name=kernel,
            cwd=str(ROOT),
            progress_bar=progress,
            execution_timeout=timeout,
            **extra,
        )
    except pm.PapermillExecutionError as exc:
        raise DistlabError(
            f"notebook {src.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue} (executed copy: "
            f"{dst})"
        ) from None
    return dst


def notebook_kernel(path: str | Path) -> str | None:
    """The kernelspec name ``path``'s metadata asks for (None when it names none or is unreadable)."""
    try:
        name = json.loads(Path(path).read_text())["metadata"]["kernelspec"]["name"]
    except (OSError, ValueError, LookupError, TypeError):
        return None  # papermill reports what is wrong with the file
    return name if isinstance(name, str) and name else None


def installed_kernels() -> set[str]:
    """The names of the Jupyter kernels installed here (a notebook asks for one of them)."""
    from jupyter_client.kernelspec import KernelSpecManager

    return set(KernelSpecManager().find_kernel_specs())


def export_html(notebook: str | Path, dst: str | Path) -> Path:
    """Export an executed notebook to a standalone HTML page (plotly charts included)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(notebook), as_version=4)
    _plotly_as_html(nb)
    body, _ = HTMLExporter().from_notebook_node(nb)
    dst = Path(dst)
    dst.write_text(body)
    return dst


PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _plotly_as_html(nb: Any) -> None:
    """Give every plotly output an HTML rendering, and every widget (the picker) a static one
    from its saved state: the page shows them offline, plotly.js embedded once."""
    import plotly.io as pio

    first = [True]

    def figure_html(data: Mapping[str, Any]) -> str:
        fig = pio.from_json(json.dumps(data[PLOTLY_MIME]), skip_invalid=True)
        out = pio.to_html(fig, include_plotlyjs=first[0], full_html=False)
        first[0] = False
        return out

    state = ((nb.get("metadata") or {}).get("widgets") or {}).get(WIDGET_STATE, {}).get("state", {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            if PLOTLY_MIME in data and "text/html" not in data:
                data["text/html"] = figure_html(data)
            view = data.get(WIDGET_VIEW)
            if view and view.get("model_id") in state:
                data["text/html"] = _widget_html(state, view["model_id"], figure_html)
                del data[WIDGET_VIEW]  # the static rendering, not a view that needs the widgets' JavaScript
    (nb.get("metadata") or {}).pop("widgets", None)  # so the page loads no widget manager from a CDN


def _widget_html(state: Mapping[str, Any], model_id: str, figure_html: Any) -> str:
    """A widget tree as it last looked, statically: HTML and labels as they are, a control as
    ``description: value``, a list as its options, an Output's figures (plotly) and text."""
    import html

    model = state.get(model_id) or {}
    st = model.get("state") or {}
    name = model.get("model_name", "")
    if "children" in st:
        parts = [_widget_html(state, c.removeprefix("IPY_MODEL_"), figure_html) for c in st["children"]]
        flex = "row" if name == "HBoxModel" else "column"
        return (
            f"<div style='display:flex;flex-direction:{flex};gap:6px;flex-wrap:wrap'>{''.join(parts)}</div>"
        )
    if name == "OutputModel":
        bits = []
        for o in st.get("outputs") or []:
            d = o.get("data") or {}
            if PLOTLY_MIME in d:
                bits.append(figure_html(d))
            elif "text/html" in d:
                bits.append(d["text/html"])
            elif "text/plain" in d or "text" in o:
                bits.append(f"<pre>{html.escape(str(d.get('text/plain') or o.get('text', '')))}</pre>")
        return "<div style='width:100%'>" + "".join(bits) + "</div>"
    if name in ("HTMLModel", "LabelModel"):
        return f"<div>{st.get('value', '')}</div>"
    if name == "SelectModel":
        labels = st.get("_options_labels") or []
        return "<pre style='margin:0'>" + "\n".join(html.escape(str(x)) for x in labels) + "</pre>"
    if name == "ButtonModel":
        return f"<button disabled>{html.escape(str(st.get('description', '')))}</button>"
    value = st.get("value")
    if "_options_labels" in st:  # a Dropdown or ToggleButtons: its value is an index into its labels
        i = st.get("index")
        value = (
            st["_options_labels"][i] if isinstance(i, int) and 0 <= i < len(st["_options_labels"]) else None
        )
    if value is not None:
        label = html.escape(str(st.get("description", "")))
        return f"<div style='font-size:90%'>{label}: <b>{html.escape(str(value))}</b></div>"
    return ""
