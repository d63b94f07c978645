"""Execute notebooks headless with papermill (explicit kernel) and export them to HTML."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from distlab.errors import DistlabError

ROOT = Path(__file__).resolve().parent.parent.parent
KERNEL = "python3"


def execute_notebook(
    src: str | Path,
    dst: str | Path,
    params: Mapping[str, Any] | None = None,
    *,
    kernel: str = KERNEL,
    progress: bool = True,
    timeout: int | None = None,
) -> Path:
    """Run ``src`` into ``dst`` with ``params`` injected after its ``parameters`` cell."""
    import papermill as pm

    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise DistlabError(f"notebook {str(src)!r} does not exist")
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
        )
    except pm.PapermillExecutionError as exc:
        raise DistlabError(
            f"notebook {src.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue} (executed copy: {dst})"
        ) from None
    return dst


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


def _plotly_as_html(nb: Any) -> None:
    """Give every plotly output an HTML rendering (plotly.js embedded once) so the page shows it offline."""
    import plotly.io as pio

    first = True
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            if PLOTLY_MIME in data and "text/html" not in data:
                fig = pio.from_json(json.dumps(data[PLOTLY_MIME]), skip_invalid=True)
                data["text/html"] = pio.to_html(fig, include_plotlyjs=first, full_html=False)
                first = False
