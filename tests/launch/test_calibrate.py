"""Lab.calibrate() on the live 2-worker cluster: a fitted CostModel, cached, feeding lab.runs predictions."""

from __future__ import annotations

import pytest
from launch_helpers import allreduce_strategy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_calibrate_fits_caches_and_predicts_runs(clean_lab, tiny, blobs, tmp_path, monkeypatch):
    from distlab.costmodel import CostModel

    clean_lab.cache_dir = tmp_path
    cm = clean_lab.calibrate(progress=False)
    assert isinstance(cm, CostModel) and clean_lab.cost_model is cm
    alpha, beta = cm.params.alpha_beta["allreduce/intra"]
    assert alpha > 0 and beta > 0  # measured here, not the defaults
    # the training-loop stage ran the real loop at world 1 and 2: every reference model under
    # the runtime's main paths (1 + 4 + 2 + 4 runs per world, less gossip on one rank)
    from distlab.launch.calibrate import BUILDERS

    runs = cm.fingerprint["overhead_runs"]
    assert len(runs) == 9 + 11 and {r["world"] for r in runs} == {1, 2}
    assert {r["world"] for r in runs if r["builder"] == "Gossip"} == {2}
    assert all(r["gossip_bytes"] > 0 for r in runs if r["builder"] == "Gossip")
    assert {r["builder"] for r in runs} == set(BUILDERS)
    assert {r["tensors"] for r in runs if r["builder"] == "PartitionedPS"} == {26, 14}  # MLP-12, wide_deep
    assert all(r["measured"] > 0 and r["predicted"] > 0 for r in runs)
    p = cm.params
    assert min(p.step_overhead, p.rank_overhead, p.tensor_overhead) >= 0
    assert p.step_overhead + p.rank_overhead + p.tensor_overhead > 0  # the loop costs something
    cached = list(tmp_path.glob("calibration-*.json"))
    assert len(cached) == 1
    calls = []
    monkeypatch.setattr(clean_lab, "run_ranks", lambda *a, **k: calls.append(a) or [])
    again = clean_lab.calibrate(progress=False)
    assert calls == [] and again.params == cm.params  # read from the cache, nothing ran
    monkeypatch.undo()

    run = clean_lab.launch(
        tiny, strategy=allreduce_strategy(tiny, clean_lab.resources), steps=5, data=blobs, block=True
    )
    row = clean_lab.runs.set_index("run_id").loc[run.id]
    assert row["predicted_throughput"] > 0


def test_calibrate_with_no_cache_measures_again(clean_lab, tmp_path):
    clean_lab.cache_dir = tmp_path
    clean_lab.calibrate(cache=False, progress=False, sizes=[4096, 65536])
    assert list(tmp_path.glob("calibration-*.json")) == []
