"""A real JupyterLab driven by Debian's Chromium (Playwright): what the browser test and the
live-view benchmark share.

``jupyterlab(root)`` serves ``root`` on a free loopback port (news, update checks and the
extension manager off, every cell rendered); ``chromium(errors)`` opens one large page whose
JavaScript errors go to ``errors``; ``run_all(page, url, token, name)`` opens a notebook, waits
for its kernel, runs every cell and waits until all ran or one failed. Needs ``playwright`` and
``chromium`` (``apt-get install chromium``): ``missing()`` says which is absent.
"""

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]


def missing() -> str | None:
    """What the browser harness lacks here, or None."""
    if not os.path.exists(CHROMIUM):
        return "Debian's chromium is not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def jupyterlab(root: Path, within: float = 90.0) -> Iterator[tuple[str, str]]:
    """A JupyterLab server on ``root``: yields (url, token); a server that does not answer within
    ``within`` seconds is one ``RuntimeError`` with the end of its log."""
    root = Path(root)
    # render every cell (JupyterLab 4 virtualises long notebooks, hiding off-screen outputs)
    settings = root / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    news = root / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JUPYTER_CONFIG_DIR": str(root / "cfg")}
    log = open(root / "lab.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.news_url=None",
            f"--LabApp.user_settings_dir={root / 'settings'}",
            "--ServerApp.allow_root=True",
            "--LabApp.extension_manager=readonly",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=root,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + within
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(
                        "jupyter lab did not start: " + (root / "lab.log").read_text()[-2000:]
                    ) from None
                time.sleep(0.5)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def benign(error: str) -> bool:
    """jupyterlab-plotly resizes a plot whose Output (a live view, a picker chart) was just redrawn,
    its old div already detached, and throws this; the new div draws. The only error a page may show."""
    return error.startswith("Resize must be passed a displayed plot div element")


@contextlib.contextmanager
def chromium(errors: list[str]) -> Iterator[tuple[Any, Any]]:
    """Debian's Chromium with one large page; the page's JavaScript errors go to ``errors``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.on("pageerror", lambda exc: None if benign(str(exc)) else errors.append(str(exc)))
        yield browser, page


def run_all(page: Any, url: str, token: str, name: str, wait: bool = True) -> bool:
    """Open ``name`` in JupyterLab, wait for its kernel, run every cell and (``wait``) wait until
    all ran (or one failed). Returns whether JupyterLab marked the notebook changed on opening it,
    before anything ran (it does when the file's ``language_info`` is not its kernel's)."""
    page.goto(f"{url}/lab/tree/{name}?token={token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.wait_for_function("window.jupyterapp && window.jupyterapp.serviceManager", timeout=60_000)
    page.wait_for_function(
        """() => { const nb = window.jupyterapp.shell.currentWidget;
                   const s = nb && nb.sessionContext && nb.sessionContext.session;
                   const k = s && s.kernel;
                   return k && k.status === 'idle'; }""",
        timeout=120_000,
        polling=500,
    )
    page.wait_for_timeout(2000)
    changed = bool(page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.dirty"))
    # not awaited: the command's promise settles when the last cell has run
    started = page.evaluate(
        "() => { try { window.jupyterapp.commands.execute('notebook:run-all-cells'); "
        "return 'ok'; } catch (e) { return String(e); } }"
    )
    if started != "ok":
        raise RuntimeError(f"run-all-cells failed in JupyterLab: {started}")
    if wait:
        wait_done(page)
    return changed


def wait_done(page: Any, timeout_ms: int = 600_000) -> None:
    """Until every code cell has an execution count and the kernel is idle, or a cell raised (an
    ``error`` output: run-all stops there). A warning on stderr is not an end: the kernel goes idle
    for a moment between the cells of a run-all, and a check that took any stderr output for a
    failure returned before the rest had run."""
    page.wait_for_function(
        """() => {
          const nb = window.jupyterapp.shell.currentWidget;
          if (!nb || !nb.content || !nb.sessionContext.session) return false;
          const cells = [...nb.content.widgets].filter(c => c.model.type === 'code');
          const raised = cells.some(c => {
            const outs = c.model.outputs;
            for (let i = 0; i < outs.length; i++) if (outs.get(i).type === 'error') return true;
            return false;
          });
          const idle = nb.sessionContext.session.kernel.status === 'idle';
          return idle && (cells.every(c => c.model.executionCount !== null) || raised);
        }""",
        timeout=timeout_ms,
        polling=2000,
    )


def browser_rss() -> int:
    """Resident memory of the browser's processes (bytes): the Chromium process Playwright started
    and every process below it (renderers, GPU, utility)."""
    import psutil

    pid = browser_pid()
    if pid is None:
        return 0
    try:
        top = psutil.Process(pid)
        procs = [top, *top.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def browser_pid() -> int | None:
    """The Chromium process's pid: the child of this process running ``CHROMIUM``."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            cmd = child.cmdline()
            if (
                cmd
                and os.path.basename(cmd[0]).startswith(("chromium", "chrome"))
                and not any(a.startswith("--type=") for a in cmd)
            ):
                return child.pid
    return None


def in_thread(fn: Any) -> Any:
    """``fn()`` on a thread of its own, its result or its exception: Playwright's sync API refuses
    a thread whose asyncio loop runs (a notebook kernel's)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()
