"""The quickstart in a real JupyterLab driven by Debian's Chromium: picker and charts render."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SMALL = {
    "model_name": "mlp",
    "model_options": {"width": 64, "in_features": 32},
    "workers": 2,
    "steps": 8,
    "top": 1,
    "calibrate_sizes": [4096, 65536],
}

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    pytest.importorskip("playwright.sync_api")
    # render every cell (JupyterLab 4 virtualises long notebooks, hiding off-screen outputs)
    settings = tmp_path / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    news = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=None",
            f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
            "--ServerApp.allow_root=True",
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        stdout=open(tmp_path / "lab.log", "w"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail("jupyter lab exited: " + (tmp_path / "lab.log").read_text()[-2000:])
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("jupyter lab did not answer within 90 s")
    yield url, token, tmp_path
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _place(nb, path: Path) -> Path:
    """Write ``nb`` where JupyterLab serves it; return the folder screenshots go to."""
    import nbformat

    nbformat.write(nb, path)
    out = ROOT / "out"
    out.mkdir(exist_ok=True)
    return out


def _benign(error: str) -> bool:
    """jupyterlab-plotly resizes a plot whose Output (a live view, a picker chart) was just redrawn,
    its old div already detached, and throws this; the new div draws. The only error a page may show."""
    return error.startswith("Resize must be passed a displayed plot div element")


@contextlib.contextmanager
def _chromium(errors: list[str]):
    """Debian's Chromium with one large page; the page's JavaScript errors go to ``errors``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.on("pageerror", lambda exc: None if _benign(str(exc)) else errors.append(str(exc)))
        yield browser, page


def _run_notebook(page, url: str, token: str, name: str) -> None:
    """Open ``name`` in JupyterLab, wait for its kernel, run every cell, wait until all ran (or one
    failed)."""
    page.goto(f"{url}/lab/tree/{name}?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.serviceManager", timeout=60_000)
    # wait for the notebook's kernel to be ready, then run every cell
    page.wait_for_function(
        """() => { const nb = window.jupyterapp.shell.currentWidget;
                   const s = nb && nb.sessionContext && nb.sessionContext.session;
                   const k = s && s.kernel;
                   return k && k.status === 'idle'; }""",
        timeout=120_000,
        polling=500,
    )
    page.wait_for_timeout(2000)
    started = page.evaluate(
        "async () => { try { await window.jupyterapp.commands.execute('notebook:run-all-cells'); return "
        "'ok'; "
        "}"
        " catch (e) { return String(e); } }"
    )
    assert started == "ok", started
    # done when every code cell has an execution count and the kernel is idle (or a cell failed)
    page.wait_for_function(
        """() => {
          const nb = window.jupyterapp.shell.currentWidget;
          if (!nb || !nb.content || !nb.sessionContext.session) return false;
          const cells = [...nb.content.widgets].filter(c => c.model.type === 'code');
          const stderr = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']";
          const failed = document.querySelector(stderr);
          const idle = nb.sessionContext.session.kernel.status === 'idle';
          return idle && (cells.every(c => c.model.executionCount !== null) || failed !== null);
        }""",
        timeout=600_000,
        polling=2000,
    )


def _output_with_title(page, title: str):
    """The output area whose plotly chart's title contains ``title``."""
    return page.locator(".jp-OutputArea-output", has=page.locator(".gtitle", has_text=title)).first


def test_quickstart_renders_picker_and_charts(jupyterlab):
    """The quickstart runs in JupyterLab; then the picker's what-if controls and its Launch are
    driven as a user would, and the picker, the first run's live view and its timeline are
    photographed (out/picker.png, out/live-run.png, out/timeline.png: docs/ holds the ones checked)."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    url, token, root = jupyterlab
    nb = parameterize_notebook(load_notebook_node(str(ROOT / "notebooks" / "quickstart.ipynb")), SMALL)
    nb.cells = [c for c in nb.cells if "lab.close()" not in c.source]  # the picker launches after the run-all
    out, errors = _place(nb, root / "quickstart.ipynb"), []
    with _chromium(errors) as (browser, page):
        _run_notebook(page, url, token, "quickstart.ipynb")
        tracebacks = page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback"
        ).count()
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
    assert tracebacks == 0, "a cell raised in JupyterLab"
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
