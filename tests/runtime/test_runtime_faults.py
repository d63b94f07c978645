"""Bad input and faults: mismatched strategies fail before step 0 on every rank; a failing rank never hangs
the others."""

from __future__ import annotations

import pytest
from runtime_bodies import FAILING_CASES, failing_key, faults_body, stop_body

from distlab.errors import LaunchError, StrategyError
from distlab.runtime.spawn import spawn_local

WORLD = 2


@pytest.fixture(scope="module")
def faults():
    return spawn_local(WORLD, faults_body, timeout=150, return_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "kind, named",
    [
        ("missing", "'2.bias' has no plan"),
        ("extra", "'ghost.weight' is not a trainable parameter"),
        ("shape", "'2.bias'"),
    ],
)
def test_mismatched_strategy_fails_on_every_rank_before_the_first_step(faults, kind, named):
    for r in range(WORLD):
        err = faults[r][kind]
        assert isinstance(err, StrategyError), f"rank {r}: {err!r}"
        assert named in str(err) and "\n" not in str(err)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "case", range(len(FAILING_CASES)), ids=[failing_key(i) for i in range(len(FAILING_CASES))]
)
def test_failing_rank_ends_every_rank_quickly_naming_it(faults, case):
    # by position: AllReduce runs first and again last, and each outcome is checked
    err1, t1 = faults[1][failing_key(case)]
    assert isinstance(err1, LaunchError)
    assert "rank 1 failed at step 2: ValueError: injected failure" in str(err1)
    err0, t0 = faults[0][failing_key(case)]
    assert isinstance(err0, LaunchError)
    # the peer's error names rank 1 in rank 1's own words (its step too): the driver shows these
    # when rank 0's error reaches it first (a cell's own error once lost its step and line that way)
    said = "rank 1 failed at step 2: ValueError: injected failure"
    assert f"rank 0: stopped because rank 1 failed: LaunchError: {said}" in str(err0)
    # the collective timeout is 20 s: the survivor must learn of the failure long before it
    assert t0 < 10, f"rank 0 took {t0:.1f} s to stop"


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_failed_stale_run_leaves_no_server_thread_behind(faults):
    assert [faults[r]["ps threads"] for r in range(WORLD)] == [[], []]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_should_stop_on_one_rank_stops_all_at_the_same_step():
    res = spawn_local(WORLD, stop_body, timeout=100)
    assert [r["stopped"] for r in res] == [True, True]
    assert res[0]["steps"] == res[1]["steps"] < 50


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_spawn_local_reports_a_dead_rank_instead_of_hanging():
    with pytest.raises(LaunchError, match="did not finish within"):
        spawn_local(2, _sleeper, timeout=6)


def _sleeper(rank, world, addr, port):
    import time

    time.sleep(60 if rank == 1 else 0)
    return rank


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_spawn_local_runs_a_returned_rank_job():
    from runtime_bodies import make_job

    res = spawn_local(2, make_job, "builder:PS:servers=all", "dense", "sgd", 2, timeout=100)
    assert [r["rank"] for r in res] == [0, 1] and [r["steps"] for r in res] == [2, 2]
    assert res[0]["state_dict"] is not None and res[1]["state_dict"] is None
