"""Lab.calibrate() on the live 2-worker cluster: a fitted CostModel, cached, feeding lab.runs predictions."""

from __future__ import annotations

import time

import pytest
from launch_helpers import allreduce_strategy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_calibrate_fits_caches_and_predicts_runs(clean_lab, tiny, blobs, tmp_path):
    from distlab.costmodel import CostModel

    clean_lab.cache_dir = tmp_path
    t0 = time.monotonic()
    cm = clean_lab.calibrate(progress=False)
    took = time.monotonic() - t0
    assert isinstance(cm, CostModel) and clean_lab.cost_model is cm
    assert took <= 60, took
    alpha, beta = cm.params.alpha_beta["allreduce/intra"]
    assert alpha > 0 and beta > 0  # measured here, not the defaults
    cached = list(tmp_path.glob("calibration-*.json"))
    assert len(cached) == 1
    t0 = time.monotonic()
    again = clean_lab.calibrate(progress=False)
    assert time.monotonic() - t0 < 2 and again.params.alpha_beta == cm.params.alpha_beta

    run = clean_lab.launch(
        tiny, strategy=allreduce_strategy(tiny, clean_lab.resources), steps=5, data=blobs, block=True
    )
    row = clean_lab.runs.set_index("run_id").loc[run.id]
    assert row["predicted_throughput"] > 0


def test_calibrate_with_no_cache_measures_again(clean_lab, tmp_path):
    clean_lab.cache_dir = tmp_path
    clean_lab.calibrate(cache=False, progress=False, sizes=[4096, 65536])
    assert list(tmp_path.glob("calibration-*.json")) == []
