"""Calibration's row types round-trip through their stored form, and the fits read them as they read dicts."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError, fields, replace
from pathlib import Path

import pytest

from distlab.costmodel import CostModel, CostParams
from distlab.costmodel.calibrate import (
    COMPUTE_TERMS,
    OVERHEAD_TERMS,
    fit_compute,
    fit_microbenchmarks,
    fit_overhead,
)
from distlab.costmodel.rows import CollectiveRow, ComputeFitRow, LocalStep, LoopRun, overhead_features
from distlab.errors import CalibrationError

from .test_calibrate import synthetic_rows
from .toys import allreduce, exact_model, plan, toy_profile, toy_resources

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION = ROOT / "datasets/measurements/cost-model-accuracy-2026-11-23n.calibration.json"

EXAMPLES = [
    CollectiveRow(
        collective="allreduce", world=2, nbytes=4096, seconds=1.5e-4, link="intra", repeats=5, threads=1
    ),
    CollectiveRow(
        collective="compute",
        world=2,
        seconds=0.0132,
        alone=0.012,
        contention=1.1,
        flops=4e8,
        ranks_on_host=2,
        cores=2,
        threads=1,
        host="vm",
    ),
    LocalStep(key="adf87ab08a761b12", ranks=2, cores=2, batch=8, seconds=3.1e-4),
    LocalStep(key="adf87ab08a761b12", ranks=1, batch=2, seconds=1e-4),
    ComputeFitRow(measured=0.01, profiled=0.008, tensors=26, ranks_on_host=3, cores=2, profile_threads=2),
    LoopRun(
        world=3,
        builder="PS",
        tensors=14,
        calls=7.0,
        gather_calls=3,
        sparse_units=2,
        ps_units=12,
        measured=0.004,
        predicted=0.003,
        compute=0.002,
        comm=0.001,
        comm_alpha=4e-4,
        ranks_on_host=3,
        cores=2,
    ),
]


@pytest.mark.parametrize("row", EXAMPLES, ids=lambda r: type(r).__name__)
def test_every_row_type_round_trips_through_its_dict_and_json(row):
    d = row.to_dict()
    assert type(row).from_dict(d) == row
    assert type(row).from_dict(json.loads(json.dumps(d))) == row
    assert list(d) == [f.name for f in fields(row)]  # every field, in declaration order
    with pytest.raises(FrozenInstanceError):  # a row is a record of what was measured
        setattr(row, fields(row)[0].name, None)


def test_the_committed_calibrations_rows_keep_their_stored_form():
    d = json.loads(CALIBRATION.read_text())
    fp = d["fingerprint"]
    for cls, rows in (
        (LocalStep, fp["local_steps"]),
        (LoopRun, fp["overhead_runs"]),
        (LocalStep, d["compute_runs"]),
    ):
        typed = [cls.from_dict(r) for r in rows]
        # same keys, order, values and types; a field added since (LoopRun.hidden, format 23) at its default
        added = {f.name: f.default for f in fields(cls) if f.name not in rows[0]}
        assert set(added) <= {"hidden"}
        stored = [{f.name: r.get(f.name, added.get(f.name)) for f in fields(cls)} for r in rows]
        assert [r.to_dict() for r in typed] == stored
        assert json.dumps([r.to_dict() for r in typed]) == json.dumps(stored)


def test_a_model_fitted_from_typed_rows_stores_and_reloads_them_as_dicts(tmp_path):
    fp = json.loads(CALIBRATION.read_text())["fingerprint"]
    runs, steps = fp["overhead_runs"], fp["local_steps"]
    typed = (
        CostModel()
        .with_overhead([LoopRun.from_dict(r) for r in runs])
        .with_compute([LocalStep.from_dict(r) for r in steps])
    )
    plain = CostModel().with_overhead(runs).with_compute(steps)
    current = [LoopRun.from_dict(r).to_dict() for r in runs]  # the stored runs with today's fields
    assert typed.params == plain.params and typed.fingerprint["overhead_runs"] == current
    again = CostModel.load(typed.save(tmp_path / "cm.json"))
    assert again.fingerprint["overhead_runs"] == current and again.compute.to_rows() == steps


def test_a_row_missing_a_field_names_the_row_and_the_field():
    with pytest.raises(
        CalibrationError,
        match=r"overhead runs\[1\]: missing \['measured'\]; rows come from Lab.calibrate\(\)",
    ):
        fit_overhead(CostParams(), [EXAMPLES[-1], {"world": 1, "tensors": 4, "predicted": 0.5}])
    with pytest.raises(CalibrationError, match=r"compute runs: missing \['key', 'batch'\]"):
        LocalStep.from_dict({"ranks": 1, "seconds": 0.1})


def test_the_fits_give_the_same_params_from_dicts_and_from_rows():
    fp = json.loads(CALIBRATION.read_text())["fingerprint"]
    params, fit_rows, runs = _committed_inputs()
    assert fit_compute(params, fit_rows) == fit_compute(
        params, [ComputeFitRow.from_dict(r) for r in fit_rows]
    )
    assert fit_overhead(params, runs) == fit_overhead(params, [LoopRun.from_dict(r) for r in runs])
    micro = synthetic_rows()
    assert fit_microbenchmarks(micro, CostParams()) == fit_microbenchmarks(
        [CollectiveRow.from_dict(r) for r in micro], CostParams()
    )
    assert len(fp["local_steps"]) == len(fit_rows) == 20 and len(runs) == 53


def test_overhead_features_are_a_loop_run_but_its_measurement():
    prof, res = toy_profile(), toy_resources(2, cores=2)
    features = overhead_features(exact_model(), prof, res, plan(prof, allreduce(0, 0, 0), res, per_replica=8))
    run = LoopRun(**features, measured=0.05)
    assert set(run.to_dict()) - set(features) == {"measured"}
    assert run.world == 2 and run.tensors == 3 and run.ranks_on_host == 2 and run.cores == 2
    assert 0 <= run.comm_alpha <= run.comm and run.predicted > 0


def _committed_inputs() -> tuple[CostParams, list[dict], list[dict]]:
    """The committed calibration's params before its training-loop fit, its reference models'
    local steps as fit_compute rows and its training-loop runs.

    A calibration does not store the reference models' profiles, so each local step's profiled
    compute is taken as 0.8x the same model's one-rank step at that batch, and the models are
    given 4, 6, 8, ... tensors in the order of their keys: fixed inputs, not a measurement.
    """
    d = json.loads(CALIBRATION.read_text())
    params = CostParams.from_dict(d["params"])
    local, runs = d["fingerprint"]["local_steps"], d["fingerprint"]["overhead_runs"]
    keys = sorted({r["key"] for r in local})
    one = {(r["key"], r["batch"]): r["seconds"] for r in local if r["ranks"] == 1}
    fit_rows = [
        {
            "measured": r["seconds"],
            "profiled": 0.8 * one[(r["key"], r["batch"])],
            "tensors": 4 + 2 * keys.index(r["key"]),
            "ranks_on_host": r["ranks"],
            "cores": r["cores"],
            "profile_threads": 2,
        }
        for r in local
    ]
    # the wire and latency scales as the microbenchmarks leave them, before the loop's fit
    before_loop = params.with_(comm_scale=1.0, alpha_scale=1.0, comm_oversubscription=0.0)
    return before_loop, fit_rows, runs


# What fit_compute and fit_overhead gave on _committed_inputs() before the row types and the
# tables of terms (distlab/costmodel/calibrate.py at commit 6e6021b, run from a copy of that file
# with this repository's numpy and scipy).
BEFORE_COMPUTE = {
    "step_overhead": 6.196830258728212e-05,
    "tensor_overhead": 6.242739029930328e-22,
    "compute_scale": 0.8495634407555376,
    "contention": 0.5407840549932045,
    "oversubscription": 3.070824854856067e-12,
}
BEFORE_OVERHEAD = {
    "runtime_overhead": 0.0001574292795472736,
    "rank_overhead": 0.001070964755078972,
    "hook_overhead": 6.569786787281719e-06,
    "comm_scale": 0.17188630202488075,
    "comm_oversubscription": 0.8597329882720356,
    "call_overhead": 0.0003479947257988984,
    "peer_call_overhead": 6.505795572410505e-05,
    "sparse_unit_overhead": 0.00016935368856963576,
    "gather_peer_overhead": 0.0001109281742254041,
    "gossip_tensor_overhead": 3.152778306025078e-22,
    "alpha_scale": 0.5596997059420323,
    "ps_unit_overhead": 3.794900242357926e-05,
}


def test_refitting_a_committed_calibration_gives_the_params_the_positional_fits_gave():
    params, fit_rows, runs = _committed_inputs()
    # the table of terms as it was then (gossip_per_byte was fitted from calibration format 16 on)
    # and overlap_loss and the priors on the loop-fitted terms from format 23 on
    then = tuple(
        replace(t, prior=0) for t in OVERHEAD_TERMS if t.param not in ("gossip_per_byte", "overlap_loss")
    )
    # and lockstep_overhead in the compute fit from format 18 on
    then_compute = tuple(replace(t, prior=0) for t in COMPUTE_TERMS if t.param != "lockstep_overhead")
    compute = fit_compute(params, fit_rows, terms=then_compute)
    overhead = fit_overhead(params, runs, terms=then)
    # terms held at their bound of 0 come out as solver noise near 1e-22 s: abs=1e-18 s forgives that.
    # The compute fit's points carry one more field since format 18, which moved the solver's path for
    # the terms at their bound (tensor_overhead 6.2e-22 s, oversubscription 3.1e-12: relative changes
    # of 3e-6 and 6e-6, absolute ones below 1e-16, which abs=1e-15 forgives); the fitted terms moved by
    # at most 2.5e-10 (step_overhead), so rel=1e-8 holds them as tightly as the overhead fit's.
    assert {k: getattr(compute, k) for k in BEFORE_COMPUTE} == pytest.approx(
        BEFORE_COMPUTE, rel=1e-8, abs=1e-15
    )
    assert {k: getattr(overhead, k) for k in BEFORE_OVERHEAD} == pytest.approx(
        BEFORE_OVERHEAD, rel=1e-8, abs=1e-18
    )
    # and every other field as it was
    assert compute.with_(**{k: getattr(params, k) for k in BEFORE_COMPUTE}) == params
    assert overhead.with_(**{k: getattr(params, k) for k in BEFORE_OVERHEAD}) == params
