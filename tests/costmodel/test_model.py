"""CostModel as a user meets it: rank many candidates, sweep what-ifs, goodput, rendering, save/load."""

from __future__ import annotations

import numpy as np
import pytest

from distlab.costmodel import CostModel, Prediction
from distlab.errors import CalibrationError
from distlab.strategy.types import GossipConfig, Sync

from .toys import allreduce, exact_model, plan, toy_profile, toy_resources


def _candidates(prof, res):
    return [
        plan(prof, allreduce(0, 1, 2), res, builder="AllReduce"),
        plan(prof, allreduce(0, 0, 0), res, builder="AllReduce1"),
        plan(prof, [Sync("ps", server=0)] * 3, res, builder="PS"),
        plan(prof, [Sync("ps", server=r % res.world) for r in range(3)], res, builder="PSLoadBalancing"),
        plan(prof, [Sync("gossip")] * 3, res, gossip=GossipConfig("exp2", True, "atc"), builder="Gossip"),
        plan(prof, allreduce(0, 1, 2, compressor="fp16"), res, builder="AllReduceFP16"),
    ]


def test_rank_10k_evaluations_sorted_and_consistent_with_predict():
    prof, res = toy_profile(), toy_resources(4)
    cm = exact_model(beta=1e-7, optimizer_per_byte=1e-9)
    cands = _candidates(prof, res) * 1700  # ~10k evaluations
    table = cm.rank(prof, res, cands)
    assert len(table) == len(cands)
    thr = table["throughput"].to_numpy()
    assert np.all(np.diff(thr) <= 0)
    for col in (
        "strategy",
        "builder",
        "throughput",
        "step_time",
        "compute",
        "comm",
        "optimizer",
        "index",
        "plan",
    ):
        assert col in table.columns
    np.testing.assert_allclose(table[["compute", "comm", "optimizer"]].sum(axis=1), table["step_time"])
    best = table.iloc[0]
    assert best["plan"] is cands[best["index"]]
    one = cm.predict(prof, res, best["plan"])
    assert one.throughput == pytest.approx(best["throughput"])
    # the single-server PS is the slowest on 4 ranks with a slow network
    assert table.iloc[-1]["builder"] == "PS"


def test_rank_by_goodput_prefers_smaller_global_batch_when_noise_scale_is_small():
    prof, res = toy_profile(), toy_resources(2)
    cm = exact_model()
    small = plan(prof, allreduce(0, 1, 2), res, per_replica=32, builder="b32")
    large = plan(prof, allreduce(0, 1, 2), res, per_replica=256, builder="b256")
    by_thr = cm.rank(prof, res, [small, large])
    assert by_thr.iloc[0]["builder"] == "b256"
    by_good = cm.rank(prof, res, [small, large], noise_scale=50.0)
    assert by_good.iloc[0]["builder"] == "b32"
    p = cm.predict(prof, res, large, noise_scale=50.0)
    assert p.efficiency == pytest.approx((50 + 32) / (50 + 512))
    assert p.goodput == pytest.approx(p.throughput * p.efficiency)


def test_sweep_world_sizes_and_bandwidths():
    prof, res = toy_profile(), toy_resources(2, cores=2)
    cm = exact_model(alpha=1e-4, beta=1e-8)
    cands = _candidates(prof, res)[:3]
    df = cm.sweep(prof, res, cands, worlds=[1, 2, 4, 8], bandwidths=[None, 1e9, 1e10])
    assert len(df) == 3 * 4 * 3
    ar = df[(df["index"] == 1) & df["bandwidth"].isna()].set_index("world")
    assert ar.loc[1, "comm"] == 0.0
    # world 2 matches predict on the resources themselves
    assert ar.loc[2, "throughput"] == pytest.approx(cm.predict(prof, res, cands[1]).throughput)
    # more bandwidth, less communication, at every world size > 1
    for w in (2, 4, 8):
        rows = df[(df["index"] == 1) & (df["world"] == w)].sort_values("bandwidth")
        assert rows["comm"].iloc[0] > rows["comm"].iloc[1]
    # resources hold 2 ranks per host: a world of 4 spans 2 hosts and pays the (slower) inter-host link
    cm.params.alpha_beta["allreduce/inter"] = (1e-4, 1e-7)
    df = cm.sweep(prof, res, cands[1:2], worlds=[4]).iloc[0]
    assert df["comm"] == pytest.approx(6 * 1e-4 + 1.5 * 16000 * 1e-7)


def test_prediction_renders_itself():
    prof, res = toy_profile(), toy_resources(2)
    p = exact_model().predict(prof, res, plan(prof, allreduce(0, 1, 2), res))
    assert isinstance(p, Prediction)
    html = p._repr_html_()
    assert "samples/s" in html and "compute" in html and "comm" in html
    assert p.total == p.step_time
    assert "toy" in repr(p)


def test_save_load_round_trip(tmp_path):
    from tests.costmodel.test_calibrate import synthetic_rows

    prof, res = toy_profile(), toy_resources(4)
    cm = CostModel.from_microbenchmarks(synthetic_rows(), res)
    path = cm.save(tmp_path / "calib.json")
    back = CostModel.load(path)
    assert back.fingerprint == cm.fingerprint
    assert back.params == cm.params
    cands = _candidates(prof, res)
    np.testing.assert_allclose(
        back.rank(prof, res, cands)["throughput"], cm.rank(prof, res, cands)["throughput"]
    )
    assert "allreduce/intra" in back._repr_html_()


def test_load_errors_are_one_line(tmp_path):
    with pytest.raises(CalibrationError, match="cannot read"):
        CostModel.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CalibrationError, match="not valid JSON"):
        CostModel.load(bad)


def test_compiled_strategy_is_cached_per_identity():
    prof, res = toy_profile(), toy_resources(2)
    cm = CostModel.default()
    s = plan(prof, allreduce(0, 1, 2), res)
    assert cm.compile(prof, s) is cm.compile(prof, s)
    other = plan(prof, allreduce(0, 0, 0), res)
    assert cm.compile(prof, other) is not cm.compile(prof, s)
    assert len(cm.compile(prof, other).task_ar_bytes) == 1


def test_every_builder_candidate_gets_a_finite_prediction():
    import distlab as dl

    prof = dl.ModelProfile.from_variables(
        [
            ("emb", (5000, 16), "float32", True),
            ("fc1.weight", (256, 256)),
            ("fc1.bias", (256,)),
            ("out.weight", (10, 256)),
        ],
        batch_size=16,
        time_per_sample=1e-3,
    )
    res = dl.ResourceSpec.local(workers=4)
    cands = dl.strategy.candidates(prof, res)
    table = CostModel.default().rank(prof, res, cands)
    assert len(table) == len(cands) and set(table["builder"]) >= {"PS", "AllReduce", "Gossip"}
    assert np.isfinite(table["throughput"]).all() and (table["throughput"] > 0).all()
    assert (table["world"] == 4).all()


def test_re_ranking_after_a_change_never_serves_stale_numbers():
    prof, res = toy_profile(), toy_resources(4, cores=2)
    cm = exact_model(beta=1e-7)
    cands = _candidates(prof, res)
    first = cm.rank(prof, res, cands).set_index("index")["step_time"]
    assert cm.rank(prof, res, cands).set_index("index")["step_time"].equals(first)  # cached, same answer
    cm.params.alpha_beta["allreduce/intra"] = (1e-4, 1e-6)  # in place: a 10x slower all-reduce
    slower = cm.rank(prof, res, cands).set_index("index")["step_time"]
    assert slower[1] > first[1]
    before = cm.rank(prof, res, cands).set_index("index")["compute"][1]
    cm.params = cm.params.with_(contention=0.5)  # 4 ranks on 2 cores: 2 * (1 + 0.5) instead of 2 * 1
    assert cm.rank(prof, res, cands).set_index("index")["compute"][1] == pytest.approx(1.5 * before)
