"""What a user notices first: the quickstart's kernel and its logo, dir(distlab), ignored checkpoints,
and calibration's bar moving part by part."""

from __future__ import annotations

import io
import json
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from tests.calibrations import two_reference_models

ROOT = Path(__file__).resolve().parents[1]
KERNEL_DIR = ROOT / "kernels" / "distlab"


def _notebook(path: Path) -> dict:
    return json.loads(path.read_text())


def _sources(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def test_quickstart_opens_in_the_distlab_kernel_which_loads_the_extension():
    spec = json.loads((KERNEL_DIR / "kernel.json").read_text())
    nb = _notebook(ROOT / "notebooks" / "quickstart.ipynb")
    kernelspec = nb["metadata"]["kernelspec"]
    assert (
        kernelspec["name"] == "distlab"
        and kernelspec["display_name"] == spec["display_name"] == "Python 3 (distlab)"
    )
    assert spec["argv"][-2:] == ["--ext", "distlab"]
    assert any("%distlab" in s for s in _sources(nb))  # the magics it uses come from the kernel
    # a %load_ext in the distlab kernel prints "The distlab extension is already loaded"
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        nb = _notebook(path)
        if nb["metadata"].get("kernelspec", {}).get("name") == "distlab":
            assert not [s for s in _sources(nb) if "%load_ext distlab" in s], (
                f"{path.name} loads the extension again"
            )


@pytest.fixture
def ran(monkeypatch, tmp_path):
    """execute_notebook with papermill replaced by a recorder of the kernel and arguments it was given."""
    import papermill

    calls: list[dict] = []
    monkeypatch.setattr(papermill, "execute_notebook", lambda src, dst, **kw: calls.append(kw))
    return calls


def _write_notebook(path: Path, kernel: str | None, source: str = "print(1)") -> Path:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    if kernel is not None:
        nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": "python"}
    nbformat.write(nb, path)
    return path


def test_execute_notebook_runs_a_notebook_in_its_own_kernel_when_installed(ran, monkeypatch, tmp_path):
    from distlab.notebook import execute as run

    ours = _write_notebook(tmp_path / "ours.ipynb", "distlab")
    other = _write_notebook(tmp_path / "other.ipynb", "julia-1.9")
    bare = _write_notebook(tmp_path / "bare.ipynb", None)
    monkeypatch.setattr(run, "installed_kernels", lambda: {"python3", "distlab"})
    run.execute_notebook(ours, tmp_path / "out.ipynb", progress=False)
    run.execute_notebook(ours, tmp_path / "out.ipynb", kernel="python3", progress=False)  # explicit: it wins
    run.execute_notebook(other, tmp_path / "out.ipynb", progress=False)
    run.execute_notebook(bare, tmp_path / "out.ipynb", progress=False)
    assert [c["kernel_name"] for c in ran] == ["distlab", "python3", "python3", "python3"]
    assert not any("extra_arguments" in c for c in ran)
    # without the distlab kernel installed, python3 loads the extension as that kernel would
    monkeypatch.setattr(run, "installed_kernels", lambda: {"python3"})
    run.execute_notebook(ours, tmp_path / "out.ipynb", progress=False)
    assert ran[-1]["kernel_name"] == "python3" and ran[-1]["extra_arguments"] == ["--ext", "distlab"]


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.timeout(180)
def test_a_distlab_notebook_has_the_magics_without_loading_them(tmp_path, monkeypatch):
    import nbformat

    from distlab.notebook import execute as run

    probe = "print(sorted(get_ipython().magics_manager.magics['line']).count('distlab'))"
    src = _write_notebook(tmp_path / "probe.ipynb", "distlab", probe)
    kernels = ["distlab"] if "distlab" in run.installed_kernels() else []  # the kernel itself, if installed
    for kernel in [*kernels, "python3 --ext distlab"]:
        if kernel != "distlab":
            monkeypatch.setattr(run, "installed_kernels", lambda: {"python3"})
        out = run.execute_notebook(src, tmp_path / "out.ipynb", progress=False)
        text = "".join(o.get("text", "") for o in nbformat.read(out, as_version=4).cells[0].outputs)
        assert text == "1\n", f"{kernel}: {text!r}"


def _png(path: Path) -> tuple[int, int]:
    """(width, height) of a well-formed PNG: signature, IHDR first, every chunk's CRC, pixels that inflate."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path.name}: bad CRC in {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, color = struct.unpack(">IIBB", chunks[0][1][:10])
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    pixels = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    assert len(pixels) == height * (1 + width * channels * depth // 8)
    return width, height


@pytest.mark.parametrize("size", [32, 64])
def test_the_kernelspec_has_a_logo(size):
    assert _png(KERNEL_DIR / f"logo-{size}x{size}.png") == (size, size)


def test_dir_lists_the_public_names_without_importing_them():
    probe = (
        "import json, sys, distlab; names = dir(distlab); "
        "print(json.dumps([names, [m for m in ('torch', 'dask', 'distributed', 'plotly', 'ipywidgets') if m "
        "in sys.modules]]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    names, heavy = json.loads(done.stdout)
    assert {"Lab", "zoo", "plot", "StrategyPicker", "profile", "CostModel", "__version__"} <= set(names)
    assert not {"Any", "importlib", "annotations"} & set(names)
    assert names == sorted(names)
    assert heavy == []  # listing the lazy names imported none of them
    import distlab

    assert not hasattr(distlab, "Any") and not hasattr(distlab, "importlib")


def test_notebook_checkpoints_are_ignored():
    patterns = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()]
    assert ".ipynb_checkpoints/" in patterns
    git = shutil.which("git")
    if git is not None and (ROOT / ".git").exists():
        checked = subprocess.run(
            [git, "check-ignore", "-q", "notebooks/.ipynb_checkpoints/quickstart-checkpoint.ipynb"], cwd=ROOT
        )
        assert checked.returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_calibration_progress_moves_part_by_part(lab, monkeypatch, tmp_path):
    """The bar moves a call on the workers or a reference model profiled at a time, each named,
    its total known up front (it had 3 stages, one of them most of the time)."""
    import torch
    import tqdm.auto
    import tqdm.std

    from distlab.calibration import campaign as calibrate
    from distlab.calibration import measure
    from distlab.calibration.repeat import LINK_REPEATS

    bars: list = []

    class Recording(tqdm.std.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "file": io.StringIO()})
            self.events: list[tuple[float, int, str]] = []
            bars.append(self)

        def update(self, n=1):
            self.events.append((time.monotonic(), n, self.postfix or ""))
            return super().update(n)

    calls: list[tuple[str, float]] = []
    real = lab.cluster.run_ranks

    def spy(fn, *args, **kwargs):
        began = time.monotonic()
        out = real(fn, *args, **kwargs)
        calls.append((fn.__name__, time.monotonic()))
        spans.append((began, time.monotonic()))
        return out

    spans: list[tuple[float, float]] = []

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    monkeypatch.setattr(lab.cluster, "run_ranks", spy)
    lab.cache_dir = tmp_path
    # a calibration cached for this cluster: cache=False measures all the same and leaves it alone
    from distlab.costmodel import CostModel

    cached = tmp_path / f"calibration-{calibrate.cache_key(lab.resources, [4096, 65536])}.json"
    CostModel.default().save(cached)
    before = cached.read_text()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    start = time.monotonic()
    with two_reference_models():  # what the bar shows per part, not the stage's whole size
        cm = lab.calibrate(sizes=[4096, 65536], cache=False, models=[(model, data)], batch_size=8)
        references = len(calibrate.reference_cases())
    end = time.monotonic()
    assert cm.fingerprint["calibrated"] and cached.read_text() == before
    assert [p.name for p in tmp_path.glob("calibration-*.json")] == [cached.name]

    (bar,) = bars
    loop_calls = sum(name == "loop_pass_rank" for name, _ in calls) - 2 * measure.MODEL_PASSES
    # the total known up front: the collectives' calls (LINK_REPEATS), each reference model's profile, at most
    # OVERHEAD_PASSES training-loop calls at each of world sizes 1 and 2, then the model's passes
    expected = LINK_REPEATS + references + measure.OVERHEAD_PASSES * 2 + measure.MODEL_PASSES * 2
    assert bar.total == expected >= 20 and round(bar.n, 6) == bar.total  # no part is > 1/20 of the bar
    assert loop_calls >= 2 and len(calls) == LINK_REPEATS + loop_calls + 2 * measure.MODEL_PASSES
    parts = [n for _, n, _ in bar.events]
    # inside each call the workers' ticks move the bar by fractions of its part (rank 0's
    # progress.tick per collective size, per local step, per training-loop case)
    for began, returned in spans:
        assert any(began <= t <= returned and 0 < n < 1 for t, n, _ in bar.events), (began, returned)
    # each call on the workers moves the bar before the next call returns
    for (_, returned), (_, next_returned) in zip(calls, [*calls[1:], ("end", end)]):
        assert any(returned <= t <= next_returned for t, _, _ in bar.events)
    named = " | ".join(p for _, _, p in bar.events)
    for part in (
        "collectives at 2 ranks",
        "profiling Sequential (2 of 2 reference models)",
        "training loop at 1 rank, pass 1",
        "training loop at 2 ranks, pass 1",
        "local step of Sequential at 2 ranks, pass 8 of 8",
    ):
        assert part in named
    times = [start, *(t for t, _, _ in bar.events)]
    # the longest a part held the bar: one call's time, reported, not asserted (the cores are shared)
    gap = max(b - a for a, b in zip(times, times[1:]))
    print(f"calibration {end - start:.1f} s in {len(parts)} updates, the bar still at most {gap:.1f} s")
