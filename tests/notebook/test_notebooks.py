"""Every committed notebook executes through papermill with small parameters and shows its results."""

from __future__ import annotations

import json
import multiprocessing
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import nbformat
import pytest

from distlab import bench
from distlab.bench import browser
from distlab.bench.emulate import EmulatedHosts
from distlab.cli import main
from distlab.notebook.execute import execute_notebook, export_html
from tests.calibrations import SHARED_SIZES

ROOT = Path(__file__).resolve().parents[2]
SMALL_MLP = {"width": 64, "in_features": 32}
PLOTLY = "application/vnd.plotly.v1+json"

# Small but real parameters per notebook (the defaults are the benchmark-sized ones).
SMALL: dict[str, dict] = {
    "quickstart": {"model_options": SMALL_MLP, "steps": 6, "top": 1, "calibrate_sizes": SHARED_SIZES},
    "gossip": {"n": 4, "steps": 8},
    "strategies": {"model_name": "mlp", "model_options": SMALL_MLP, "workers": 2},
    "bench/profile-speed": {"models": ["mlp"], "repeats": 1, "profile_repeats": 1},
    "bench/profile-accuracy": {"models": ["gru_lm"], "batch": 4, "rounds": 1, "loop_steps": 2},
    "bench/simulator-speed": {
        "layers": 4,
        "copies": 5,
        "predict_sample": 10,
        "repeats": 1,
        "sweep_worlds": [1, 2],
        "sweep_bandwidths": [None],
        "picker_repeats": 1,
    },
    "bench/sweep": {"models": [["mlp", SMALL_MLP]], "strategies": ["AllReduce", "PS"], "steps": 4},
    "bench/shared-cluster": {  # one round each way, three short runs: the queue, the rounds, the checks
        "rounds": 1,
        "interval": 1.0,
        "jobs": [["small", 16, 32, 1, 120], ["wide", 32, 128, 1, 80], ["deep", 16, 32, 2, 100]],
    },
    "bench/live-view": {"steps": 300, "rounds": 1, "width": 16},
    "bench/runtime-overhead": {
        "models": {"mlp": SMALL_MLP},
        "batch": {"mlp": 8},
        "steps": 4,
        "warmup": 1,
        "repeats": 1,
    },
    "bench/gossip-vs-allreduce": {
        "worlds": [2],
        "model_opts": SMALL_MLP,
        "steps": 4,
        "warmup": 1,
        "repeats": 1,
    },
    "bench/ps-vs-allreduce": {
        "model_opts": {"rows": 2000, "fields": 2},
        "steps": 4,
        "warmup": 1,
        "repeats": 1,
    },
    "bench/sparse-exchange": {
        "model": ["wide_deep", {"rows": 2000, "fields": 2}],
        "builders": ["PS"],
        "worlds": [2],
        "steps": 4,
        "warmup": 1,
        "repeats": 1,
    },
    "bench/launch-latency": {"relaunches": 2, "spawn_reference": False},
    "bench/keras-routes": {"model_options": {"width": 32}, "steps": 5, "rounds": 1},
    "bench/trace-overhead": {
        "models": [["mlp", SMALL_MLP]],
        "strategies": ["AllReduce"],
        "steps": 6,
        "rounds": 1,
    },
    "bench/launch-overhead": {"pairs": 1, "steps": 10},
    "bench/fail-fast": {"rounds": 1},
    "bench/ddp": {
        "pairs": 1,
        "models": {"tiny": {"options": {"in_features": 32, "width": 64}, "steps": 12, "warmup": 4}},
    },
    "bench/own-loop": {
        "pairs": 1,
        "models": {"tiny": {"options": {"in_features": 32, "width": 64}, "steps": 12, "warmup": 4}},
    },
    "bench/adaptive-batch": {
        "tasks": ["quadratic"],
        "sweep": [16],
        "steps": {"quadratic": 60, "digits": 60},
        "target": {"quadratic": 40.0, "digits": 2.0},
        "rounds": 1,
    },
    "bench/two-hosts": {
        "rates": ["1gbit"],
        "models": ["recommender"],
        "strategies": ["AllReduce", "PSLoadBalancing"],
        "workers_per_host": 1,
        "rows_in_table": 2000,
        "width": 64,
        "steps": 4,
        "repeats": 1,
        "calibrate": False,
    },
    "bench/trace-whatif": {  # zoo and notebook models: no test runs distlab.holdout's
        "models": ["mlp", "tagger"],
        "model_options": {"mlp": SMALL_MLP},
        "families": ["AllReduce", "PS"],
        "steps": 6,
        "rounds": 1,
        "calibrate": False,
        "emulated_models": [],
    },
    "bench/consistency": {
        "models": ["tabular"],
        "workers": 2,
        "steps": 10,
        "staleness": [0, "async"],
        "rounds": 1,
        "probe_steps": 10,
    },
    "bench/async-gossip": {
        "models": ["tabular"],
        "workers": 2,
        "steps": 10,
        "rounds": 1,
        "put_bytes": 2**20,
        "put_rounds": 2,
    },
    "bench/async-pace": {"width": 32, "steps": 12, "rounds": 1},
    "bench/prediction-paths": {  # the diagnostic set: no test runs distlab.holdout's models
        "model_set": "diagnostic",
        "models": "mlp",
        "builders": "AllReduce",
        "batch": 8,
        "steps": 4,
        "rounds": 2,
        "samples": 256,
        "calibrate_sizes": SHARED_SIZES,
        "calibration_cache": True,  # a cached calibration of these sizes serves, if one is (BENCHMARKS)
        "calibrations": 1,  # one: a calibration refused under load is not cached, and three would each run
    },
    "bench/cost-model-accuracy": {
        "models": ["gru_lm"],
        "strategies": ["AllReduce", "PS"],
        "worlds": [1, 2],
        "batches": [8],
        "steps": 4,
        "min_seconds": 0.05,
        "repeats": 2,
        "load_processes": 0,
        "calibrate_sizes": SHARED_SIZES,
        "calibration_cache": True,  # a cached calibration of these sizes serves, if one is (BENCHMARKS)
    },
}

NOTEBOOKS = sorted(
    str(p.relative_to(ROOT / "notebooks").with_suffix("")) for p in (ROOT / "notebooks").rglob("*.ipynb")
)

pytestmark = [pytest.mark.notebook, pytest.mark.slow]


def test_every_notebook_has_small_parameters_and_a_parameters_cell():
    assert set(NOTEBOOKS) == set(SMALL), "add small parameters for new notebooks to SMALL"
    for name in NOTEBOOKS:
        nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{name}: needs exactly one cell tagged 'parameters'"
        assert not any(
            c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code"
        ), f"{name} has outputs"


def _values(array) -> list:
    """A plotly JSON array: a list, or plotly 6's typed array ({"dtype", "bdata": base64})."""
    if isinstance(array, dict):
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def _errors(nb) -> list[str]:
    return [
        o.get("ename", "") for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]


USER_NOTEBOOKS = [n for n in NOTEBOOKS if not n.startswith("bench/")]


def _notebook_in_child(name: str, folder: str) -> tuple[str, str]:
    """(pool process) the user notebook ``name`` with its small parameters, as
    ``test_notebook_executes`` asks: ("ok", the executed notebook's path) or ("failed", the
    traceback). The quickstart runs with a Keras zoo model in a plain "python3" kernel."""
    params, kernel = SMALL[name], None
    if name == "quickstart":
        params, kernel = {**SMALL[name], "model_name": "keras_mlp"}, "python3"
    try:
        out = execute_notebook(
            ROOT / "notebooks" / f"{name}.ipynb",
            Path(folder) / f"{Path(name).name}.ipynb",
            params,
            kernel=kernel,
            progress=False,
        )
        return "ok", str(out)
    except Exception:  # noqa: BLE001 - the notebook's test reports it
        return "failed", traceback.format_exc()[-6000:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", USER_NOTEBOOKS)
def test_notebook_executes(name, executions):
    """Each user notebook runs whole. The quickstart runs with a Keras zoo model in a plain "python3"
    kernel, no ``--ext distlab`` (Colab, VS Code, Binder: ``import distlab`` registers %distlab); its
    torch default runs in the distlab kernel in the browser test and in ``make demo``. The
    quickstart's calibration reads the cluster's part from the suite's shared one (conftest.py)."""
    future, tmp_path = executions[name]
    status, text = future.result()
    assert status == "ok", f"notebook {name} failed:\n{text}"
    out = Path(text)
    nb = nbformat.read(out, as_version=4)
    assert not _errors(nb)
    plots = [
        o
        for c in nb.cells
        for o in c.get("outputs", [])
        if "application/vnd.plotly.v1+json" in (o.get("data") or {})
    ]
    assert plots, f"{name} showed no chart"
    html = export_html(out, tmp_path / "page.html").read_text()
    view = "application/vnd.jupyter.widget-view+json"
    widgets = [o for c in nb.cells for o in c.get("outputs", []) if view in (o.get("data") or {})]
    state = (
        nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    )
    pickers = [
        o
        for o in widgets
        if "distlab-picker" in state[o["data"][view]["model_id"]]["state"].get("_dom_classes", [])
    ]
    # every chart offline in the page: each figure once, the picker's two drawn from its saved state
    assert html.count('class="plotly-graph-div"') == len(plots) + 2 * len(pickers)
    assert (
        html.count("plotly.js v") <= 1 and "widget-view+json" not in html
    )  # plotly.js once; no widget JavaScript
    if name == "quickstart":
        assert pickers and "hosts like this" in html and "Launch" in html  # the picker, as it last looked
        # light outputs: figures as JSON, no copy of plotly.js in the saved notebook
        assert out.stat().st_size < 2_000_000 and "FigureWidget" not in out.read_text()
        timeline = [o for o in plots if "per rank (ms)" in str(o["data"][PLOTLY]["layout"].get("title"))]
        assert len(timeline) == 1  # the first run's timeline, traced
    if name == "quickstart":  # the run's live view: redrawn after its cell returned, final in the file
        figs = [o["data"]["application/vnd.plotly.v1+json"] for o in plots]
        live = [f for f in figs if f["layout"].get("title", {}).get("text", "").startswith("run ")]
        assert len(live) == 1, [f["layout"].get("title") for f in figs]
        steps = SMALL[name]["steps"]
        assert f"finished ({steps}/{steps} steps)" in live[0]["layout"]["title"]["text"]
        loss = [t for t in live[0]["data"] if t.get("name") == "loss"][0]
        assert len(_values(loss["x"])) == steps and all(v == v for v in _values(loss["y"]))
        assert {t.get("name") for t in live[0]["data"]} >= {"measured", "predicted", "rank 0", "rank 1"}
        text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
        assert "measured" in text and "samples/s" in text  # the launched runs measured their throughput
        shown = "".join(
            "".join(o.get("data", {}).get("text/html", "")) for c in nb.cells for o in c.get("outputs", [])
        )
        assert "keras_mlp" in shown and "Dense" in shown  # the profile names the Keras model and its layers


# profile-speed runs through the command line instead (test_cli_bench_prints_the_table): the same
# bench.run_bench, and a benchmark's fresh kernel costs seconds
BY_CLI = "profile-speed"


BENCHMARKS = [
    n.removeprefix("bench/") for n in NOTEBOOKS if n.startswith("bench/") and not n.endswith(BY_CLI)
]
# notebooks executed at once: each waits seconds on its kernel's and its Lab's start (the whole
# suite used 1.15 of the 2 cores), and these tests check what a notebook wrote, not its timings
AT_ONCE = 2  # the module alone: 2 took 217 s, 3 took 204 (one run each): not worth a third kernel


def _bench_in_child(name: str, out_dir: str) -> tuple[str, object]:
    """(pool process) ``bench.run_bench`` as ``distlab bench`` runs it: ("ok", its result as JSON
    text) or ("failed", the traceback), which a test reports. As text: a NaN the JSON holds is then
    json's one NaN in the test's process too, which compares equal to itself in a dict."""
    try:
        result = bench.run_bench(name, SMALL[f"bench/{name}"], out_dir=out_dir, progress=False)
        return "ok", json.dumps(result)
    except Exception:  # noqa: BLE001 - the benchmark's test reports it
        return "failed", traceback.format_exc()[-6000:]


@pytest.fixture(scope="module")
def executions(request, tmp_path_factory):
    """``{name: (future, its out folder)}``: every selected user notebook (``_notebook_in_child``),
    then every selected benchmark notebook (``_bench_in_child``, as ``distlab bench`` runs it), each
    in a fresh kernel, ``AT_ONCE`` at a time in that order. The quickstart and the benchmarks whose
    ``calibration_cache`` asks for it read the suite's shared calibration (conftest.py): on their
    own, such small calibrations are never cached in a whole suite (their 4-64 KiB collectives' fits
    differ by 2x-200x between repeats, and notebooks running two at a time see each other as load),
    so each calibrated (40-60 s)."""
    tests = ("test_notebook_executes", "test_benchmark_writes_its_figures")
    selected = {
        (item.originalname, item.callspec.params["name"])
        for item in request.session.items
        if getattr(item, "originalname", "") in tests
    }
    users = [n for n in USER_NOTEBOOKS if ("test_notebook_executes", n) in selected]
    skip = {"live-view"} if browser.missing() else set()
    benches = [
        n for n in BENCHMARKS if ("test_benchmark_writes_its_figures", n) in selected and n not in skip
    ]
    if "quickstart" in users or any(SMALL[f"bench/{n}"].get("calibration_cache") for n in benches):
        request.getfixturevalue("shared_calibration")
    pool = ProcessPoolExecutor(AT_ONCE, mp_context=multiprocessing.get_context("spawn"))
    out: dict[str, tuple[Future, Path]] = {}
    for name, child in [*((n, _notebook_in_child) for n in users), *((n, _bench_in_child) for n in benches)]:
        folder = tmp_path_factory.mktemp(Path(name).name)
        out[name] = (pool.submit(child, name, str(folder)), folder)
    yield out
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", BENCHMARKS)
def test_benchmark_writes_its_figures(name, executions):
    if name == "live-view" and (why := browser.missing()):
        pytest.skip(why)
    future, tmp_path = executions[name]
    status, text = future.result()
    assert status == "ok", f"benchmark {name} failed:\n{text}"
    result = json.loads(text)
    if name == "two-hosts" and (why := EmulatedHosts.available()):  # the notebook ran and says why
        assert result["summary"]["skipped"] == why and not result["rows"], result["summary"]
        pytest.skip(f"two-hosts: {why}")
    assert result["rows"], f"{name} wrote no rows"
    assert (tmp_path / f"{name}.ipynb").exists()
    assert json.loads((tmp_path / f"{name}.json").read_text()) == result
    if name == "live-view":  # both kinds of run, and the view seen in the browser as it trained
        summary = result["summary"]
        assert sorted(r["mode"] for r in result["rows"]) == ["headless", "live"]
        assert summary["throughput_ratio"] > 0 and summary["end_lag_s"] is not None, summary
    if name == "cost-model-accuracy":  # the headline figures beside the ceiling the noise sets on them
        summary = result["summary"]
        assert {"mape", "noise_floor", "spearman_min", "regret_max"} <= set(summary)
        assert 0.0 <= summary["ceiling_share_regret_max_met"] <= 1.0 and summary["ceiling_mape"] >= 0.0
        assert summary["gru_lm_mape"] == summary["mape"]  # per model, beside the overall figures
    if name == "trace-whatif":  # identity, swap and world what-ifs, each beside the analytic error
        summary = result["summary"]
        kinds = {r.get("what") for r in result["rows"] if r.get("kind") == "whatif"}
        assert kinds == {"world 2->3", "swap to PS"}, kinds
        assert summary["identity_error_median"] >= 0 and summary["replay_seconds_1024_ranks"] > 0
        assert summary["bandwidth_skipped"] == "no emulated_models"
    if name == "consistency":  # every staleness in every condition, priced, and the goodput probe
        summary = result["summary"]
        runs = [r for r in result["rows"] if r.get("kind") != "probe"]
        assert {(r["condition"], r["staleness"]) for r in runs} == {
            (c, s) for c in ("none", "jitter", "straggler") for s in ("0", "async")
        }
        assert all(r["predicted_throughput"] > 0 and r["measured_throughput"] > 0 for r in runs)
        assert summary["error_median_out_of_sample"] >= 0 and "goodput_spearman_median" in summary
    if name == "async-gossip":  # every program slowed and predicted; the put against the isend
        summary = result["summary"]
        runs = [r for r in result["rows"] if r.get("kind") != "put"]
        assert {r["program"] for r in runs} == {"allreduce", "sync_gossip", "async_push_sum", "async_average"}
        assert all(r["measured_throughput"] > 0 and r["predicted_throughput"] > 0 for r in runs)
        assert all(r["clocks"] == [10, 10] for r in runs if r["program"].startswith("async"))
        assert summary["put_over_isend_median"] > 0 and summary["put_bytes"] == 2**20
        assert "async_push_sum_over_sync_gossip_time_to_target_median" in summary
    if name == "prediction-paths":  # both paths from one calibration, beside the noise's ceiling
        summary = result["summary"]
        assert summary["model_set"] == "diagnostic" and summary["configurations"] == 2  # AllReduce, 1 process
        assert (
            summary["profile_mape"] >= 0
            and summary["measured_step_mape"] >= 0
            and summary["ceiling_mape"] >= 0
        )
        assert summary["mlp_profile_mape"] == summary["profile_mape"]


def test_cli_bench_lists_and_rejects_unknown(capsys):
    assert main(["bench", "--list"]) == 0
    listed = capsys.readouterr().out.split()
    assert "profile-speed" in listed and "cost-model-accuracy" in listed
    assert main(["bench", "no-such-bench"]) == 2
    assert "benchmark 'no-such-bench' does not exist" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_cli_bench_prints_the_table(capsys, tmp_path):
    """``distlab bench`` with small parameters: the table printed, and the benchmark's notebook
    and figures written as test_benchmark_writes_its_figures checks the others'."""
    # SMALL's parameters, as a user types them
    params = ["-p", "models", "[mlp]", "-p", "repeats", "1", "-p", "profile_repeats", "1"]
    assert main(["bench", BY_CLI, *params, "--out", str(tmp_path), "-q"]) == 0
    out = capsys.readouterr().out
    assert "mlp" in out and "profile_seconds" in out
    written = json.loads((tmp_path / f"{BY_CLI}.json").read_text())
    assert written["rows"], f"{BY_CLI} wrote no rows"
    assert (tmp_path / f"{BY_CLI}.ipynb").exists()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_parameter_of_a_notebook_is_one_papermill_reads(name, caplog):
    """papermill skips (with a log line) a parameters line of two '=': a parameter it cannot set."""
    import papermill

    path = ROOT / "notebooks" / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))
    assigned = [ln.split("=")[0].strip() for ln in cell.source.splitlines() if "=" in ln.split("#")[0]]
    with caplog.at_level("WARNING", logger="papermill"):
        found = papermill.inspect_notebook(str(path))
    assert "Unable to parse" not in caplog.text
    assert sorted(found) == sorted(a for a in assigned if a.isidentifier()), name
