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
        kernel = wanted if wanted in _installed_kernels() else KERNEL
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
            f"notebook {src.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue} (executed copy: {dst})"
        ) from None
    return dst


def notebook_kernel(path: str | Path) -> str | None:
    """The kernelspec name ``path``'s metadata asks for (None when it names none or is unreadable)."""
    try:
        name = json.loads(Path(path).read_text())["metadata"]["kernelspec"]["name"]
    except (OSError, ValueError, LookupError, TypeError):
        return None  # papermill reports what is wrong with the file
    return name if isinstance(name, str) and name else None


def _installed_kernels() -> set[str]:
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
