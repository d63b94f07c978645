"""The quickstart in a real JupyterLab driven by Debian's Chromium: picker and charts render."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from distlab.bench import browser
from tests.calibrations import SHARED_SIZES

ROOT = Path(__file__).resolve().parents[2]
SMALL = {
    "model_name": "mlp",
    "model_options": {"width": 64, "in_features": 32},
    "workers": 2,
    "steps": 8,
    "top": 1,
    "calibrate_sizes": SHARED_SIZES,
}

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


@pytest.fixture
def jupyterlab(tmp_path):
    why = browser.missing()
    if why:
        pytest.skip(why)
    try:
        with browser.jupyterlab(tmp_path) as (url, token):
            yield url, token, tmp_path
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _place(nb, path: Path) -> Path:
    """Write ``nb`` where JupyterLab serves it; return the folder screenshots go to."""
    import nbformat

    nbformat.write(nb, path)
    out = ROOT / "out"
    out.mkdir(exist_ok=True)
    return out


_chromium = browser.chromium
_run_notebook = browser.run_all


def _output_with_title(page, title: str):
    """The output area whose plotly chart's title contains ``title``."""
    return page.locator(".jp-OutputArea-output", has=page.locator(".gtitle", has_text=title)).first


def test_quickstart_renders_picker_and_charts(shared_calibration, jupyterlab):
    """The quickstart runs in JupyterLab; then the picker's what-if controls and its Launch are
    driven as a user would, and the picker, the first run's live view and its timeline are
    photographed (out/picker.png, out/live-run.png, out/timeline.png: docs/ holds the ones checked).
    Its calibration reads the cluster's part from the suite's shared one (conftest.py)."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    url, token, root = jupyterlab
    nb = parameterize_notebook(load_notebook_node(str(ROOT / "notebooks" / "quickstart.ipynb")), SMALL)
    nb.cells = [c for c in nb.cells if "lab.close()" not in c.source]  # the picker launches after the run-all
    # the quickstart is saved with this project's Python; another Python's kernel rewrites the version
    nb.metadata.language_info.version = platform.python_version()
    out, errors = _place(nb, root / "quickstart.ipynb"), []
    with _chromium(errors) as (browser, page):
        opened_changed = _run_notebook(page, url, token, "quickstart.ipynb")
        raised = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback"
        ).all_inner_texts()
        assert not raised, f"a cell raised in JupyterLab: {raised[0][-1500:]}"
        plots = page.locator(".js-plotly-plot").count()
        widgets = page.locator(".jupyter-widgets .widget-dropdown select, .jupyter-widgets select").count()
        page.screenshot(path=str(out / "browser-quickstart.png"), full_page=False)
        picker = page.locator(".distlab-picker").first
        picker.scroll_into_view_if_needed()
        status = picker.locator(".widget-html-content").last
        # what if: four hosts like this one, 25 Gb/s Ethernet between them
        hosts = picker.locator(".widget-inline-hbox", has_text="hosts like this").locator("input")
        hosts.fill("4")
        hosts.press("Enter")
        picker.locator(".widget-inline-hbox", has_text="network").locator("select").select_option(
            label="25 Gb/s Ethernet"
        )
        page.wait_for_function(
            "() => document.querySelector('.distlab-picker').innerText.includes('25 Gb/s Ethernet between "
            "them')",
            timeout=30_000,
        )
        what_if = picker.inner_text()
        scaling = picker.locator(".js-plotly-plot").count()
        picker.locator("button", has_text="Launch").click()
        page.wait_for_function(
            "() => /measured [0-9,]+ samples\\/s/.test(document.querySelector('.distlab-picker').innerText)",
            timeout=300_000,
            polling=1000,
        )
        launched = status.inner_text()
        page.wait_for_timeout(1500)  # the measured point drawn
        picker.screenshot(path=str(out / "picker.png"))
        live = _output_with_title(page, "run r1-")
        live.scroll_into_view_if_needed()
        live.screenshot(path=str(out / "live-run.png"))
        timeline = _output_with_title(page, "per rank (ms)")
        timeline.scroll_into_view_if_needed()
        timeline.screenshot(path=str(out / "timeline.png"))
        rows = timeline.locator(".ytick text").all_text_contents()
        browser.close()
    assert not opened_changed, "JupyterLab marked the quickstart changed as it opened it"
    assert plots >= 2, f"expected plotly charts to render, found {plots}"
    assert widgets >= 1, "the strategy picker's controls did not render"
    assert "4 hosts like this one" in what_if and scaling == 2, what_if[-500:]
    assert (
        "the what-if (4 hosts x 2 ranks, 25 Gb/s Ethernet between hosts) is not this cluster" in launched
    ), launched
    assert {"rank 0 · training loop", "rank 1 · training loop", "predicted · training loop"} <= set(rows), (
        rows
    )
    assert not errors, f"JavaScript errors in the page: {errors[:3]}"


# README's "Your own model", cell by cell, in the distlab kernel (no %load_ext)
OWN_MODEL_CELLS = [
    """import torch, torch.nn as nn
from sklearn.datasets import load_digits
d = load_digits()
X = torch.tensor(d.data / 16, dtype=torch.float32).reshape(-1, 1, 8, 8); y = torch.tensor(d.target)
train = torch.utils.data.TensorDataset(X[:1400], y[:1400])
net = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                    nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))""",
    "%distlab cluster local 2",
    "%distlab profile net --data train",
    "%distlab launch net --strategy AllReduce --steps 500",
    """acc = (run.model.eval()(X[1400:]).argmax(1) == y[1400:]).float().mean()
print(f"held-out accuracy {acc:.3f}")""",
    "%distlab cluster stop",
]


def test_your_own_model_trains_through_the_magics_in_jupyterlab(jupyterlab):
    import nbformat

    url, token, root = jupyterlab
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in OWN_MODEL_CELLS])
    nb.metadata["kernelspec"] = {
        "name": "distlab",
        "display_name": "Python 3 (distlab)",
        "language": "python",
    }
    out, errors = _place(nb, root / "own-model.ipynb"), []
    with _chromium(errors) as (browser, page):
        _run_notebook(page, url, token, "own-model.ipynb")
        kernel = page.evaluate(
            "() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.name"
        )
        card = page.locator("table.distlab-run").first
        card.wait_for(timeout=30_000)
        text = card.inner_text()
        card.scroll_into_view_if_needed()
        card.screenshot(path=str(out / "browser-own-model-run.png"))
        said = page.locator(".jp-OutputArea-output").all_inner_texts()
        browser.close()
    assert kernel == "distlab"
    assert not [t for t in said if "Traceback" in t or t.startswith("distlab: ")], said
    assert "TensorDataset: 1,400 samples" in text and "cross-entropy" in text and "run.model" in text
    acc = next(float(t.split()[-1]) for t in said if t.startswith("held-out accuracy"))
    print(f"digits accuracy in JupyterLab through the magics: {acc:.3f}")
    assert acc > 0.5  # chance is 0.1
    assert not errors, f"JavaScript errors in the page: {errors[:3]}"
