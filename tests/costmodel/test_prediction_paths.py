"""The two ways to a prediction agree where they should: a profile and a measured step of the same model.

A synthetic model whose step in a rank is known exactly (its profile times the calibrated
slowdown, plus the loop's and the lockstep's per-step figures): measuring that step and
predicting from it must give what the profile path gives, at every world size, so the two
paths differ only by what the measurement adds (no timing here)."""

from __future__ import annotations

import pytest

from distlab.costmodel.compute import model_key
from distlab.costmodel.contention import slowdown
from distlab.costmodel.prediction import BASIS_ERROR, MEASURED_STEP, PROFILE

from .toys import allreduce, exact_model, plan, toy_profile, toy_resources

PARAMS = dict(
    compute_scale=1.3,
    contention=0.1,
    step_overhead=2e-4,
    tensor_overhead=5e-5,
    lockstep_overhead=6e-4,
    runtime_overhead=1e-4,
    hook_overhead=1e-5,
)


def _profile(e: float | None = 0.5, **meta):
    prof = toy_profile(batch=16)  # forward + backward 0.045 s at batch 16
    prof.meta.update({"threads": 2, **meta})
    if e is not None:
        prof.meta["thread_efficiency"] = e
    return prof


def _true_local_step(prof, ranks: int, cores: int, e: float, p: dict) -> float:
    """What a rank's local step takes in this synthetic world: the profile's compute model exactly."""
    slow = slowdown(ranks, cores, p["contention"], 2, e, 0.0)
    return (
        prof.compute_time * slow * p["compute_scale"]
        + p["step_overhead"]
        + p["tensor_overhead"] * len(prof.variables)
        + p["lockstep_overhead"] * (ranks > 1)
    )


@pytest.mark.parametrize("world", [1, 2])
def test_a_measured_step_equal_to_the_profiles_true_step_predicts_what_the_profile_predicts(world):
    cm = exact_model(**PARAMS)
    prof = _profile(e=0.5)
    res = toy_resources(world, cores=2)
    s = plan(prof, allreduce(0, 0, 0), res, per_replica=16)
    rows = [
        {
            "key": model_key(prof),
            "ranks": n,
            "cores": 2,
            "batch": b,
            "seconds": _true_local_step(prof, n, 2, 0.5, PARAMS) * b / 16,
        }
        for n in (1, 2)
        for b in (16,)
    ]
    from_profile = cm.predict(prof, res, s)
    from_step = cm.with_compute(rows).predict(prof, res, s)
    assert from_profile.basis == PROFILE and from_step.basis == MEASURED_STEP
    assert from_step.step_time == pytest.approx(from_profile.step_time, rel=1e-9)
    assert from_step.breakdown == pytest.approx(from_profile.breakdown, rel=1e-9)


def test_the_profiles_own_thread_scaling_sets_how_much_fewer_threads_cost():
    cm = exact_model(**PARAMS)
    two = toy_resources(2, cores=2)  # two ranks on two cores: one thread each, the profile had two
    one = toy_resources(1, cores=2)  # one rank: two threads, as profiled
    flat, steep = _profile(e=0.0), _profile(e=1.0)
    s2 = plan(flat, allreduce(0, 0, 0), two, per_replica=16)
    s1 = plan(flat, allreduce(0, 0, 0), one, per_replica=16)
    c = lambda prof, res, s: cm.predict(prof, res, s).breakdown["compute"]  # noqa: E731
    assert c(flat, one, s1) == pytest.approx(c(steep, one, s1))
    fixed = PARAMS["step_overhead"] + PARAMS["tensor_overhead"] * 3 + PARAMS["runtime_overhead"]
    fixed += PARAMS["hook_overhead"] * 3 + PARAMS["lockstep_overhead"]
    # e = 1: half the threads, twice the time; e = 0: threads buy nothing
    assert (c(steep, two, s2) - fixed) == pytest.approx(2 * (c(flat, two, s2) - fixed))
    # without a measured scaling, the calibrated exponent (0.8 by default) applies
    assert c(_profile(e=None), two, s2) - fixed == pytest.approx((c(flat, two, s2) - fixed) * 2**0.8)


def test_a_prediction_says_its_basis_its_typical_error_and_what_it_rests_on():
    prof = _profile(disturbed=True, load={"foreign": 0.9, "cores": 2})
    res = toy_resources(2, cores=2)
    s = plan(prof, allreduce(0, 0, 0), res, per_replica=16)
    uncalibrated = exact_model(**PARAMS)  # a CostModel never calibrated: fingerprint says so
    p = uncalibrated.predict(prof, res, s)
    assert p.basis == PROFILE and p.uncertainty == BASIS_ERROR[PROFILE]
    assert any("%distlab calibrate" in n for n in p.notes)
    assert any("profiled under load" in n and "0.9 of 2 cores" in n for n in p.notes)
    assert "from the profile, typically within" in p.summary() and "profiled under load" in repr(p)
    table = uncalibrated.rank(prof, res, [s])
    assert list(table["basis"]) == [PROFILE] and table.attrs["notes"] == p.notes
    calibrated = exact_model(**PARAMS)
    calibrated.fingerprint = {"calibrated": True}
    quiet = _profile()
    assert calibrated.predict(quiet, res, s).notes == ()


def test_a_profile_of_another_batch_or_a_model_too_large_says_so_in_one_line_each():
    import dataclasses

    cm = exact_model(**PARAMS)
    cm.fingerprint = {"calibrated": True}
    prof = _profile()
    res = toy_resources(2, cores=2)
    other_batch = cm.predict(prof, res, plan(prof, allreduce(0, 0, 0), res, per_replica=64))
    assert [n for n in other_batch.notes if "profiled at batch 16, predicted at 64" in n]
    assert "dl.profile(model, batch_size=64)" in other_batch.notes[0]
    s = plan(prof, allreduce(0, 0, 0), res, per_replica=16)
    roomy = dataclasses.replace(res, memory={"h0": 2**30})
    assert cm.predict(prof, roomy, s).notes == ()
    # 4,000 float32 weights: 64 KB with gradients and Adam's moments; a 32 KB worker cannot hold it
    tight = dataclasses.replace(res, memory={"h0": 32_000})
    (note,) = cm.predict(prof, tight, s).notes
    assert note.startswith("does not fit: training needs about") and "PartitionedPS" in note
