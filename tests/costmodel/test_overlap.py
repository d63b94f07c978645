"""Bucket-by-bucket overlap with backward on toy timelines, and contention when ranks share cores."""

from __future__ import annotations

import pytest

from distlab.costmodel.contention import slowdown

from .toys import ALPHA, allreduce, exact_model, plan, toy_profile, toy_resources

# Backward: v2 ready at 10 ms, v1 at 20 ms, v0 at 30 ms (gradients ready last-to-first).
# On 2 ranks a bucket of n bytes costs 2 alpha + n beta.


def _comm(bytes_beta: float, groups, sizes=(1000, 1000, 2000)):
    prof = toy_profile(sizes=sizes)
    res = toy_resources(2)
    return exact_model(alpha=ALPHA, beta=bytes_beta).predict(prof, res, plan(prof, allreduce(*groups), res))


def test_early_buckets_hide_behind_backward_only_last_is_exposed():
    pred = _comm(1e-8, (0, 1, 2))  # buckets of 40 us + 200 us .. 280 us: each done before the next is ready
    last = 2 * ALPHA + 4000 * 1e-8  # v0's bucket starts when backward ends
    assert pred.breakdown["comm"] == pytest.approx(last)
    assert pred.detail["backward_total"] > pred.breakdown["comm"]


def test_a_long_early_bucket_delays_the_rest_and_is_partly_exposed():
    beta = 1e-6  # 1 us per byte: v2's bucket (8000 B) takes 8.2 ms, v1's 4.2 ms, v0's 4.2 ms
    pred = _comm(beta, (0, 1, 2))
    t2, t1, t0 = 2 * ALPHA + 8000 * beta, 2 * ALPHA + 4000 * beta, 2 * ALPHA + 4000 * beta
    end2 = 0.010 + t2
    end1 = max(0.020, end2) + t1
    end0 = max(0.030, end1) + t0
    assert pred.breakdown["comm"] == pytest.approx(end0 - 0.030)
    beta = 4e-6  # now v2's bucket alone outlasts the remaining backward: queueing pushes the rest out
    pred = _comm(beta, (0, 1, 2))
    t2, t1, t0 = 2 * ALPHA + 8000 * beta, 2 * ALPHA + 4000 * beta, 2 * ALPHA + 4000 * beta
    assert pred.breakdown["comm"] == pytest.approx(0.010 + t2 + t1 + t0 - 0.030)


def test_one_bucket_for_everything_is_fully_exposed():
    beta = 1e-6
    pred = _comm(beta, (0, 0, 0))
    assert pred.breakdown["comm"] == pytest.approx(pred.detail["backward_total"])
    assert pred.breakdown["comm"] == pytest.approx(2 * ALPHA + 16000 * beta)
    # more buckets hide more: the user-visible reason to bucket
    assert _comm(beta, (0, 1, 2)).step_time < pred.step_time


def test_bucket_order_follows_gradient_readiness_not_group_ids():
    # group ids reversed: v0 (ready last) in group 0. Same timeline as (0, 1, 2) above.
    assert _comm(1e-6, (2, 1, 0)).breakdown["comm"] == pytest.approx(_comm(1e-6, (0, 1, 2)).breakdown["comm"])


def test_profile_without_layer_times_spreads_backward_by_size():
    from distlab.profiling.model_profile import ModelProfile

    prof = ModelProfile.from_variables([("a", (3000,)), ("b", (1000,))], batch_size=8, time_per_sample=0.003)
    res = toy_resources(2)
    cm = exact_model(beta=1e-6)
    pred = cm.predict(prof, res, plan(prof, allreduce(0, 1), res))
    # backward = 2/3 of 24 ms = 16 ms; b (1000 el) ready at 4 ms, a at 16 ms
    tb, ta = 2 * ALPHA + 4000e-6, 2 * ALPHA + 12000e-6
    assert pred.breakdown["comm"] == pytest.approx(max(0.004 + tb, 0.016) + ta - 0.016)


@pytest.mark.parametrize(
    "ranks,cores,kappa,expected", [(1, 2, 0.1, 1.0), (2, 2, 0.1, 1.1), (4, 2, 0.1, 2.2), (3, None, 0.0, 1.0)]
)
def test_slowdown_formula(ranks, cores, kappa, expected):
    assert slowdown(ranks, cores, kappa) == pytest.approx(expected)


def test_oversubscribed_cores_slow_compute_and_optimizer():
    prof = toy_profile()
    cm = exact_model(contention=0.1, optimizer_per_byte=1e-9)
    alone = cm.predict(
        prof, toy_resources(1, cores=2), plan(prof, allreduce(0, 0, 0), toy_resources(1, cores=2))
    )
    two = cm.predict(
        prof, toy_resources(2, cores=2), plan(prof, allreduce(0, 0, 0), toy_resources(2, cores=2))
    )
    four = cm.predict(
        prof, toy_resources(4, cores=2), plan(prof, allreduce(0, 0, 0), toy_resources(4, cores=2))
    )
    assert two.breakdown["compute"] == pytest.approx(1.1 * alone.breakdown["compute"])
    assert four.breakdown["compute"] == pytest.approx(2.2 * alone.breakdown["compute"])
    assert four.breakdown["optimizer"] == pytest.approx(2.2 * alone.breakdown["optimizer"])
    # 4 ranks on 2 cores barely beat 2 ranks: what a user of a 2-core laptop sees
    assert four.throughput < 1.05 * two.throughput


def test_gpu_ranks_do_not_share_cores():
    from distlab.resources import ResourceSpec
    from distlab.strategy.types import RankSpec

    prof = toy_profile()
    res = ResourceSpec(tuple(RankSpec(r, "h0", f"gpu:{r}") for r in range(4)), cores={"h0": 1})
    pred = exact_model(contention=0.5).predict(prof, res, plan(prof, allreduce(0, 0, 0), res))
    assert pred.breakdown["compute"] == pytest.approx(0.045)


def test_ranks_splitting_the_profiles_threads_run_slower_per_rank():
    # profiled on 2 threads; 2 ranks on 2 cores get 1 thread each: 2 ** 0.8 slower, plus interference
    assert slowdown(2, 2, 0.1, profile_threads=2, thread_efficiency=0.8) == pytest.approx(2**0.8 * 1.1)
    assert slowdown(1, 2, 0.1, profile_threads=2) == pytest.approx(1.0)  # one rank keeps both threads
    assert slowdown(4, 2, 0.0, profile_threads=2, thread_efficiency=1.0) == pytest.approx(4.0)
    prof = toy_profile(meta={"threads": 2})
    cm = exact_model(thread_efficiency=1.0)
    one = cm.predict(
        prof, toy_resources(1, cores=2), plan(prof, allreduce(0, 0, 0), toy_resources(1, cores=2))
    )
    two = cm.predict(
        prof, toy_resources(2, cores=2), plan(prof, allreduce(0, 0, 0), toy_resources(2, cores=2))
    )
    assert two.breakdown["compute"] == pytest.approx(2 * one.breakdown["compute"])


def test_on_a_cpu_host_what_hides_behind_backward_still_costs_its_overlap_loss():
    # the three buckets of the first test: all but v0's hide behind backward on a GPU (overlap_loss 0);
    # with overlap_loss 0.4 the step pays 40% of the hidden ones' time too
    prof = toy_profile(sizes=(1000, 1000, 2000))
    res = toy_resources(2)
    st = plan(prof, allreduce(0, 1, 2), res)
    gpu = exact_model(beta=1e-8).predict(prof, res, st)
    cpu = exact_model(beta=1e-8, overlap_loss=0.4).predict(prof, res, st)
    hidden = gpu.detail["backward_total"] - gpu.breakdown["comm"]
    assert hidden > 0 and gpu.detail["hidden"] == pytest.approx(hidden)
    assert cpu.breakdown["comm"] == pytest.approx(gpu.breakdown["comm"] + 0.4 * hidden)
    assert cpu.step_time == pytest.approx(gpu.step_time + 0.4 * hidden)
    # one bucket for everything hides nothing: nothing more to pay
    one = plan(prof, allreduce(0, 0, 0), res)
    assert exact_model(beta=1e-8, overlap_loss=0.4).predict(prof, res, one).step_time == pytest.approx(
        exact_model(beta=1e-8).predict(prof, res, one).step_time
    )
