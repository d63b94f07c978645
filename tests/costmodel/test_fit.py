"""CostModel.fit / predict_table on tables generated from a known structural model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from distlab.costmodel import CostModel
from distlab.costmodel.fit import step_time
from distlab.errors import CalibrationError

THETA = {
    "c0": 2e-3,
    "c1": 4e-4,
    "alpha_intra": 3e-4,
    "beta_intra": 2e-9,
    "alpha_inter": 1e-3,
    "beta_inter": 1e-8,
    "gamma": 1.6,
}
GRAD = 20e6  # 20 MB of gradients


def table(replicas, nodes_of=lambda p: 1, bszs=(16, 32, 64), accum=(1,), noise=0.0, seed=0) -> pd.DataFrame:
    rows = [
        {"num_nodes": nodes_of(p), "num_replicas": p, "local_bsz": m, "grad_bytes": GRAD, "accum_steps": s}
        for p in replicas
        for m in bszs
        for s in accum
    ]
    df = pd.DataFrame(rows)
    cols = {c: df[c].to_numpy(float) for c in df.columns}
    t = step_time(THETA, cols)
    df["step_time"] = t * (1 + noise * np.random.default_rng(seed).standard_normal(len(t)))
    return df


def test_recovers_known_parameters_single_node():
    df = table([1, 2, 3, 4], accum=(1, 2))
    cm = CostModel.fit(df)
    for k in ("c0", "c1", "alpha_intra", "beta_intra", "gamma"):
        assert cm.throughput_fit[k] == pytest.approx(THETA[k], rel=0.02), k
    assert cm.params.alpha_beta["allreduce/intra"] == pytest.approx(
        (THETA["alpha_intra"], THETA["beta_intra"]), rel=0.02
    )


def test_extrapolates_to_unseen_world_sizes_with_noisy_logs():
    seen = table([1, 2, 3, 4], accum=(1, 2), noise=0.02)
    cm = CostModel.fit(seen)
    unseen = table([6, 8])
    pred = cm.predict_table(unseen)
    err = np.abs(pred / unseen["step_time"].to_numpy() - 1)
    assert err.max() < 0.06


def test_multi_node_rows_fit_inter_host_figures():
    df = table([1, 2, 4, 8, 16], nodes_of=lambda p: max(1, p // 4))
    cm = CostModel.fit(df)
    assert cm.throughput_fit["beta_inter"] == pytest.approx(THETA["beta_inter"], rel=0.05)
    unseen = table([32], nodes_of=lambda p: p // 4)
    assert cm.predict_table(unseen) == pytest.approx(unseen["step_time"].to_numpy(), rel=0.03)


def test_leave_one_world_out():
    df = table([1, 2, 3, 4], noise=0.01)
    for p in (2, 3, 4):
        cm = CostModel.fit(df[df.num_replicas != p])
        held = df[df.num_replicas == p]
        assert np.abs(cm.predict_table(held) / held["step_time"].to_numpy() - 1).max() < 0.05


def test_errors_name_the_missing_piece():
    with pytest.raises(CalibrationError, match=r"missing columns \['step_time'\]"):
        CostModel.fit(pd.DataFrame({"num_nodes": [1], "num_replicas": [1], "local_bsz": [8]}))
    with pytest.raises(CalibrationError, match="CostModel.fit"):
        CostModel.default().predict_table(table([1]))


def test_fitted_model_survives_save_and_load(tmp_path):
    cm = CostModel.fit(table([1, 2, 3]))
    back = CostModel.load(cm.save(tmp_path / "cm.json"))
    df = table([5])
    assert back.predict_table(df) == pytest.approx(cm.predict_table(df))
    assert back.fingerprint == cm.fingerprint


def test_ranks_sharing_cores_carry_to_a_world_size_left_out():
    from distlab.costmodel.fit import _columns

    theta = {**THETA, "eff": 0.6}
    rows = [
        {"num_nodes": 1, "num_replicas": p, "local_bsz": m, "grad_bytes": GRAD, "cores_per_node": 2}
        for p in (1, 2, 3, 4)
        for m in (8, 32)
    ]
    df = pd.DataFrame(rows)
    df["step_time"] = step_time(theta, _columns(df, need_time=False))
    # one rank has both cores; two take one each (2 ** 0.6 slower); four take turns (x 2 more)
    cols = _columns(df, need_time=False)
    assert list(cols["thread_ratio"][::2]) == [1.0, 2.0, 2.0, 2.0]
    assert list(cols["sliced"][::2]) == [1.0, 1.0, 1.5, 2.0]
    fitted = CostModel.fit(df)
    assert fitted.throughput_fit["eff"] == pytest.approx(0.6, abs=0.02)
    # world 4 from worlds 1-3: the structure carries it
    train, test = df[df.num_replicas < 4], df[df.num_replicas == 4]
    pred = CostModel.fit(train).predict_table(test)
    assert np.max(np.abs(pred / test["step_time"].to_numpy() - 1)) < 0.02
