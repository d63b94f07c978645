"""Keras models trained natively by TensorFlow (backend="tensorflow"): MultiWorkerMirroredStrategy,
each rank a child process of its pinned Dask task."""

from __future__ import annotations

import pytest
from keras_scripts import NEVER_DEADLINE, TIMEOUT, result

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT + 60)]  # the first test waits for them all


def test_mirrored_on_two_workers_ends_with_equal_weights_a_falling_loss_and_runs_again(tensorflow_notebook):
    out = result(tensorflow_notebook, "native_mirrored")
    for r in out["runs"]:
        assert r["status"] == "finished" and r["world"] == 2 and r["backend"] == "tensorflow"
        a, b = r["checksums"]
        assert a == pytest.approx(b, rel=1e-9)  # every replica holds the same weights
        assert r["weights"] == pytest.approx(a, rel=1e-6)  # run.model holds them (a Keras model)
        assert r["model_type"] == "Sequential"
        first, last = r["losses"]
        assert last < first
        assert r["throughput"] > 0
    assert len(out["runs"]) == 2  # a second native run on the same workers
    # calibrate(backend="tensorflow"): TensorFlow's all-reduce and this model's native step, cached
    native = out["calibration"]["native"]
    assert native["world"] == 2 and native["allreduce"][1] > 0 and len(native["local"]) == 1
    assert sorted(next(iter(native["local"].values()))) == ["16", "4"]
    # measured once, written to the cache, answered from it (load detection lifted: a busy CI host)
    assert out["calibration"]["cached"] and not out["calibration"]["disturbed"]
    assert len(out["calibration"]["files"]) == 1
    for r in out["runs"]:  # predicted from those figures, not refitted as the torch runtime's
        assert r["prediction"] == "AllReduce (tensorflow)" and r["detail"]["native_local_measured"] == 1.0
        assert 0 < r["predicted"] < float("inf") and r["refitted"] != r["refitted"]  # NaN


def test_a_native_calibration_beside_busy_processes_warns_is_used_and_is_not_cached(torch_notebook):
    out = result(torch_notebook, "native_under_load")
    said = [w for w in out["warnings"] if w.startswith("CalibrationWarning")]
    assert len(said) == 1 and "not cached" in said[0] and "other programs used" in said[0], out
    assert out["native"] and out["files"] == []


def test_mirrored_on_two_ranks_equals_one_process_on_the_global_batch(torch_notebook):
    """The native route learns what one process learns: 2 ranks x 8 samples against one process
    on 16 (torch, the same Keras model and rows), SGD at 0.1, 4 steps."""
    out = result(torch_notebook, "native_equivalence")
    assert out["status"] == "finished" and out["type"] == "keras.Sequential", out
    assert out["moved"] > 1e-2  # the weights moved far more than the tolerance: the check can fail
    assert out["max_weight_difference"] < 1e-5, out


@pytest.mark.parametrize("builder", ["AllReduce", "PS"])  # PartitionedPS runs PS's processes
def test_a_rank_that_exits_early_fails_the_run_quickly_and_leaves_no_process(
    torch_notebook, tensorflow_notebook, builder
):
    """AllReduce's case runs in the torch notebook's process, PS's in the TensorFlow one's
    (keras_scripts: the two processes' seconds evened)."""
    out = result(torch_notebook if builder == "AllReduce" else tensorflow_notebook, f"native_exit_{builder}")
    assert out["status"] == "failed", out
    assert out["seconds"] < (10 if builder == "AllReduce" else 25), out
    assert "rank 1" in out["error"] and out["no_children"], out


def test_a_rank_that_never_starts_is_killed_at_the_deadline_and_leaves_no_process(torch_notebook):
    out = result(torch_notebook, "native_never")
    assert out["status"] == "failed", out
    assert "first step" in out["error"] and f"{NEVER_DEADLINE} s" in out["error"], out
    assert out["seconds"] < NEVER_DEADLINE + 15, out  # the deadline, then the group's stop
    assert out["no_children"], out


def test_what_the_native_route_cannot_run_is_one_error_naming_the_fix(torch_notebook):
    out = result(torch_notebook, "native_bad_input")
    assert "LaunchError" in out["torch_model"] and "must be a Keras model" in out["torch_model"]
    assert "not one TensorFlow runs natively" in out["gossip"] and "backend='torch'" in out["gossip"]
    assert "data is required" in out["no_data"]
    assert "'jax' is not one of" in out["unknown_backend"]
    assert "TF_CONFIG is set" in out["tf_config"] and "unset it" in out["tf_config"]
    assert (
        "CalibrationError" in out["calibrate_torch_model"]
        and "models[0] is a Linear" in out["calibrate_torch_model"]
    )
    assert "collectives need 2 or more" in out["calibrate_one_worker"]
    assert "needs data" in out["calibrate_no_data"] and "(model, (x, y))" in out["calibrate_no_data"]
    assert "backend must be 'torch' or 'tensorflow'" in out["calibrate_backend"]


def test_guard_keras_3_multi_worker_fit_still_fails_upstream(tensorflow_notebook):
    """keras#20585, tensorflow#72388: the day this fails, Keras's own fit works with two workers
    and the native route could use it instead of its custom loop."""
    out = result(tensorflow_notebook, "fit_guard")
    assert all(w["code"] != 0 for w in out["workers"]), out
    # the upstream failure itself, not a setup problem: fit hands a PerReplica value to a tensor op
    assert any("PerReplica" in w["error"] for w in out["workers"]), out


def test_ps_and_partitioned_ps_run_as_parameter_server_strategy(torch_notebook):
    out = result(torch_notebook, "native_ps")
    servers = {"/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0"}
    for builder in ("PS", "PartitionedPS"):
        r = out[builder]
        assert r["status"] == "finished" and r["steps"] == 20 and r["model"] == "Functional", (builder, r)
        first, last = r["losses"]
        assert last < first, (builder, r)
    # PS: whole variables, spread over the two servers
    assert all(len(devices) == 1 for devices in out["PS"]["placement"].values())
    assert {d for devices in out["PS"]["placement"].values() for d in devices} == servers
    # PartitionedPS: the embedding table in the builder's shards, on both servers (AutoDist's PartitionedPS)
    table = out["PartitionedPS"]["placement"]["table/embeddings"]
    assert len(table) == out["PartitionedPS"]["shards"]["table/embeddings"] >= 2 and set(table) == servers
    assert "plain SGD" in out["adam"] and "Adam" in out["adam"]
    # SGD(learning_rate=0.1, weight_decay=0.5): 4 steps on each of 2 workers, each a factor 0.95
    decay = out["decay"]
    assert decay["status"] == "finished", decay["error"]
    assert decay["table_l1_ratio"] == pytest.approx(0.95**8, abs=0.02), decay  # 1.0 without the decay


def test_a_workers_next_tensorflow_rank_starts_in_its_spare(tensorflow_notebook):
    """A worker that ran a TensorFlow rank keeps one spare process with TensorFlow imported; the
    next rank there is handed its job instead of starting a process (about 2 s of its start)."""
    out = result(tensorflow_notebook, "native_spare")
    first, second = out["runs"]
    assert first["status"] == second["status"] == "finished", out
    assert second["child"] == "spare", out
    assert len(first["spares"]) == len(second["spares"]) == 2, out  # one per worker
    assert not set(first["spares"]) & set(second["spares"]), out  # the first ones took the second run's ranks


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_no_spare_tensorflow_process_outlives_its_lab(torch_notebook, tensorflow_notebook, backend):
    """Both notebooks ran native ranks on their shared Lab, whose close ended every spare."""
    at_close = (torch_notebook if backend == "torch" else tensorflow_notebook)["spares_at_close"]
    assert len(at_close["before"]) == 2 and at_close["left"] == [], at_close
