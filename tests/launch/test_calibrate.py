"""Lab.calibrate() on the live 2-worker cluster: a fitted CostModel, cached, feeding lab.runs predictions."""

from __future__ import annotations

import warnings

import pytest
from launch_helpers import allreduce_strategy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
SIZES = [4096, 65536]  # two message sizes fit an alpha and a beta (the default sweep goes on to 8 MB)


def test_calibrate_fits_caches_and_predicts_runs(clean_lab, tiny, blobs, tmp_path, monkeypatch, load_ignored):
    from distlab.costmodel import CostModel

    clean_lab.cache_dir = tmp_path
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = clean_lab.calibrate(sizes=SIZES, progress=False)
    assert isinstance(cm, CostModel) and clean_lab.cost_model is cm
    # the reference models travel with every rank's task by design: no "large graph" warning
    assert not [w for w in caught if "large graph" in str(w.message)]
    alpha, beta = cm.params.alpha_beta["allreduce/intra"]
    assert alpha > 0 and beta > 0  # measured here, not the defaults
    # the training-loop stage ran the real loop at world 1 and 2: every reference model under
    # the runtime's main paths (1 + 4 + 3 + 3 + 2 + 4 + 1 runs per world, less gossip on one rank)
    from distlab.calibration.campaign import BUILDERS

    runs = cm.fingerprint["overhead_runs"]
    assert len(runs) == 14 + 18 and {r["world"] for r in runs} == {1, 2}
    assert {r["world"] for r in runs if r["builder"] == "Gossip"} == {2}
    assert all(r["gossip_bytes"] > 0 for r in runs if r["builder"] == "Gossip")
    assert {r["builder"] for r in runs} == set(BUILDERS)
    assert {r["tensors"] for r in runs if r["builder"] == "PartitionedPS"} == {26, 14}  # MLP-12, wide_deep
    # wide_deep's sparse rows are gathered (the all-gather path's calls, and the PS path's to its
    # servers: the same per-peer figure) by every builder at world 2, by none on one rank
    sparse = [r for r in runs if r["tensors"] == 14]
    assert {r["builder"] for r in sparse} == set(BUILDERS)
    assert all((r["gather_calls"] > 0) == (r["world"] == 2) for r in sparse)
    assert all(r["measured"] > 0 and r["predicted"] > 0 for r in runs)
    p = cm.params
    loop = (p.step_overhead, p.tensor_overhead, p.runtime_overhead, p.hook_overhead, p.rank_overhead)
    assert min(loop) >= 0 and sum(loop) > 0  # the loop and the runtime's machinery cost something
    # the training-loop stage measured every reference model's local step alone and with both ranks busy; they
    # describe no user's model, so the table the model predicts with is empty
    local = cm.fingerprint["local_steps"]
    assert {r["ranks"] for r in local} == {1, 2} and len({r["key"] for r in local}) == 7
    assert all(r["seconds"] > 0 for r in local) and len(cm.compute) == 0
    cached = list(tmp_path.glob("calibration-*.json"))
    assert len(cached) == 1
    calls = []
    monkeypatch.setattr(clean_lab.cluster, "run_ranks", lambda *a, **k: calls.append(a) or [])
    again = clean_lab.calibrate(sizes=SIZES, progress=False)
    assert calls == [] and again.params == cm.params  # read from the cache, nothing ran
    monkeypatch.undo()

    # a model to plan for: its own step at both world sizes and two batches; the rest from the cache
    from distlab.costmodel.compute import model_key
    from distlab.runs.validate import variables_profile

    real, ran, caps = clean_lab.cluster.run_ranks, [], []
    monkeypatch.setattr(
        clean_lab.cluster,
        "run_ranks",
        lambda fn, *a, **k: ran.append(fn.__name__) or caps.append(a[5]) or real(fn, *a, **k),
    )
    cm = clean_lab.calibrate(sizes=SIZES, progress=False, models=[(tiny, blobs)], batch_size=8)
    # one call per world size and pass, the world sizes in turn (MODEL_PASSES passes), each
    # with a user's model's cap on steps (higher than the reference models')
    from distlab.calibration.measure import MODEL_MAX_STEPS, MODEL_PASSES
    from distlab.runtime.loopbench import LOCAL_MAX_STEPS

    assert ran == ["loop_pass_rank"] * 2 * MODEL_PASSES
    assert caps == [MODEL_MAX_STEPS] * 2 * MODEL_PASSES and MODEL_MAX_STEPS > LOCAL_MAX_STEPS
    key = model_key(variables_profile(tiny))
    cores = clean_lab.resources.cores[clean_lab.resources.ranks[0].host]
    assert cm.compute.measured(key) == [(1, cores), (2, cores)]
    assert sorted(r["batch"] for r in cm.compute.to_rows()) == [2, 2, 8, 8]
    ran.clear()
    again = clean_lab.calibrate(sizes=SIZES, progress=False, models=[(tiny, blobs)], batch_size=8)
    assert again.compute.to_rows() == cm.compute.to_rows()
    assert ran == []  # cached with the cluster's figures
    monkeypatch.undo()

    run = clean_lab.launch(
        tiny, strategy=allreduce_strategy(tiny, clean_lab.resources), steps=5, data=blobs, block=True
    )
    row = clean_lab.runs.set_index("run_id").loc[run.id]
    assert row["predicted_throughput"] > 0


def test_calibrate_names_a_bad_model_or_batch(clean_lab, tmp_path):
    from distlab.errors import CalibrationError

    clean_lab.cache_dir = tmp_path
    with pytest.raises(CalibrationError, match=r"models\[0\] is a str; give torch nn.Modules"):
        clean_lab.calibrate(progress=False, models=["mlp"])
    with pytest.raises(CalibrationError, match="batch_size must be an integer >= 1, got 0"):
        clean_lab.calibrate(progress=False, models=[], batch_size=0)
    assert list(tmp_path.glob("*")) == []  # refused before anything ran or was written
