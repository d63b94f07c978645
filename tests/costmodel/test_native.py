"""Native TensorFlow predictions (costmodel/native.py): the fit from the ranks' bench lines, the
step as local step + all-reduce + the strategy's own cost, and the figures kept by CostModel files."""

from __future__ import annotations

import pytest

from distlab.costmodel import CostModel
from distlab.costmodel.collectives import collective_time
from distlab.costmodel.compute import model_key
from distlab.costmodel.native import NativeParams, fit_native, predict_native
from distlab.errors import CalibrationError

from .toys import allreduce, plan, toy_profile, toy_resources

ALPHA, BETA = 2e-4, 4e-9


def _bench(rank_scale: float, key_name: str = "model1") -> dict:
    sizes = [4096, 65536, 1 << 20, 4 << 20]
    reduce = [[n, rank_scale * float(collective_time("allreduce", 2, n, ALPHA, BETA))] for n in sizes]
    ref_wire = float(collective_time("allreduce", 2, 35880, ALPHA, BETA))
    return {
        "allreduce": reduce,
        "reference_bytes": 35880,
        "local": [
            ["reference", 32, 0.001],
            [key_name, 8, 0.002 * rank_scale],
            [key_name, 32, 0.005 * rank_scale],
        ],
        "mirrored": [["reference", 32, 0.001 + ref_wire + 0.0007]],
    }


def test_fit_takes_the_slowest_rank_and_recovers_alpha_beta_and_the_strategy_cost():
    native = fit_native([_bench(1.0), _bench(0.8)], ("reference", 32, 35880), {"model1": "k1"}, "2.21.0")
    assert native.world == 2
    assert native.allreduce == pytest.approx((ALPHA, BETA), rel=1e-3)
    assert native.strategy_overhead == pytest.approx(0.0007, rel=1e-3)
    assert native.local == {"k1": {8: 0.002, 32: 0.005}}  # the slower rank's
    assert native.local_step("k1", 16) == pytest.approx(0.003)  # a line through the batches
    assert native.local_step("other", 16) is None


def test_a_native_allreduce_step_is_local_step_plus_wire_plus_strategy_cost_and_survives_save(tmp_path):
    prof = toy_profile(batch=16)
    res = toy_resources(2)
    st = plan(prof, allreduce(0, 0, 0), res, builder="AllReduce")
    native = NativeParams(2, (ALPHA, BETA), 0.0007, {model_key(prof): {4: 0.002, 16: 0.004}}, "2.21.0")
    cm = CostModel.default().with_native(native)
    p = predict_native(cm.native, cm, prof, res, st)
    wire = float(collective_time("allreduce", 2, 4 * 4000, ALPHA, BETA))
    assert p.step_time == pytest.approx(0.004 + wire + 0.0007)
    assert p.throughput == pytest.approx(st.batch.per_replica * 2 / p.step_time)
    assert p.detail["native_local_measured"] == 1.0 and p.strategy.endswith("(tensorflow)")
    # a model not measured natively starts from the torch-runtime model's compute and optimizer
    other = toy_profile(sizes=(10, 20), batch=16)
    q = predict_native(native, cm, other, res, plan(other, allreduce(0, 0), res, builder="AllReduce"))
    assert q.detail["native_local_measured"] == 0.0 and q.breakdown["compute"] > 0
    # kept by the cost model's file, and by its other copies
    loaded = CostModel.load(cm.save(tmp_path / "cm.json"))
    assert loaded.native == native and cm.without_refit().native == native
    # builders TensorFlow runs asynchronously, and worlds not measured, are not predicted
    assert predict_native(native, cm, prof, res, plan(prof, allreduce(0, 0, 0), res, builder="PS")) is None
    three = toy_resources(3)
    assert (
        predict_native(native, cm, prof, three, plan(prof, allreduce(0, 0, 0), three, builder="AllReduce"))
        is None
    )


def test_malformed_native_figures_name_the_fix():
    with pytest.raises(CalibrationError, match="lab.calibrate\\(backend='tensorflow'\\)"):
        NativeParams.from_dict({"world": 2})
    with pytest.raises(CalibrationError, match="world >= 2"):
        NativeParams(1, (0.0, 0.0), 0.0)
