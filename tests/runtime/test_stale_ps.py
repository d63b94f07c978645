"""Stale-synchronous and asynchronous parameter servers (runtime/stale_ps.py) in real process groups:
every gradient applied exactly once, a loss that falls, the staleness bound held against a
straggler, staleness 0 routed to the synchronous kernels, and checkpoints that resume exactly."""

from __future__ import annotations

import pytest
import torch
from runtime_bodies import learnable_loss, linear_reference, stale_suite_body

from distlab.runtime.spawn import spawn_local

WORLD = 3


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return spawn_local(WORLD, stale_suite_body, str(tmp_path_factory.mktemp("stale")), timeout=300)


def _err(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in b)


@pytest.mark.slow
@pytest.mark.timeout(360)
@pytest.mark.parametrize("key", ["once-s1", "once-async", "once-proxy"])
def test_every_push_is_applied_exactly_once_and_every_rank_ends_with_the_servers_values(suite, key):
    # LinearLoss's gradient is its data, whatever the weights: any order and staleness of the
    # pushes ends where one process ends, unless a gradient was lost or applied twice
    ref = linear_reference(8, WORLD)
    for r in range(WORLD):
        assert suite[r][key]["steps"] == 8
        assert _err(suite[r][key]["weights"], ref) < 1e-12, (key, r)
    one_step = linear_reference(1, WORLD)
    assert _err(one_step, ref) > 1e-2  # the check could see a step missing


@pytest.mark.slow
@pytest.mark.timeout(360)
@pytest.mark.parametrize("key", ["learn-s2", "learn-async"])
def test_a_stale_or_asynchronous_run_learns(suite, key):
    # the loss of every rank's final weights on the whole data set, against the initial weights'.
    # It was rank 0's last eight batch-of-4 losses against its first eight, under 0.7: that window
    # moved with which batches met which weights (0.65-0.68 in eight runs of each key alone, 0.76
    # once inside this module, 2026-11-29), while the whole-set loss came out 0.680 of the
    # initial one (to three places) in the same runs
    start = learnable_loss()
    for r in range(WORLD):
        assert learnable_loss(suite[r][key]["weights"]) < 0.75 * start, (key, r)


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_sparse_variables_train_stale_and_end_equal_on_every_rank(suite):
    weights = [suite[r]["sparse-s1"]["weights"] for r in range(WORLD)]
    assert all(suite[r]["sparse-s1"]["steps"] == 6 for r in range(WORLD))
    assert all(_err(w, weights[0]) == 0 for w in weights[1:])


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_cancel_stops_every_rank_cleanly(suite):
    ssp = [suite[r]["stop-s1"] for r in range(WORLD)]
    assert all(x["stopped"] for x in ssp) and len({x["steps"] for x in ssp}) == 1 and ssp[0]["steps"] < 20
    asp = [suite[r]["stop-async"] for r in range(WORLD)]  # no gate: each stops at or past the agreed step
    assert all(x["stopped"] and x["steps"] < 100 for x in asp)


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_the_staleness_bound_holds_against_a_straggler_and_async_has_none(suite):
    ssp = [[rec["staleness"] for rec in suite[r]["straggler-s1"]["records"]] for r in range(WORLD)]
    asp = [[rec["staleness"] for rec in suite[r]["straggler-async"]["records"]] for r in range(WORLD)]
    for r in range(WORLD):
        clocks = [rec["clock"] for rec in suite[r]["straggler-s1"]["records"]]
        assert clocks == list(range(1, 11))
    assert max(max(s) for s in ssp) == 1, ssp  # s = 1: some step read one clock behind, none two
    assert max(max(s) for s in asp[:-1]) >= 2, asp  # the fast ranks ran ahead of the 100x-slow one
    assert all(rec["delay"] > 0 for rec in suite[WORLD - 1]["straggler-s1"]["records"])


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_staleness_zero_and_a_version_1_file_run_the_synchronous_kernels_bit_for_bit(suite):
    """s = 0 never reaches runtime/stale_ps.py: ``stale_units`` routes it to the synchronous PS
    kernels, so what this checks is that routing (and the version-1 reader), not an SSP gate at
    s = 0, which no strategy can ask for. The gate itself is checked at s = 1 against a straggler
    (the bound test below) and exactly-once at s = 1 and async (the LinearLoss test above)."""
    for r in range(WORLD):
        v1, s0 = suite[r]["v1"], suite[r]["s0"]
        assert all(torch.equal(v1[k], s0[k]) for k in v1), r
    # the synchronous kernels ran (no clock or staleness in the records); the stale ones record both
    assert "clock" not in suite[0]["s0-record"] and "staleness" not in suite[0]["v1-record"]
    assert {"clock", "staleness"} <= set(suite[0]["once-s1"]["records"][-1])


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_stale_run_checkpoints_a_consistent_cut_and_resumes_exactly(suite):
    ref = linear_reference(6, WORLD)
    for r in range(WORLD):
        assert _err(suite[r]["ckpt-full"]["weights"], ref) < 1e-12, ("full", r)
        assert _err(suite[r]["ckpt-resumed"]["weights"], ref) < 1e-12, ("resumed", r)  # nothing twice
        assert suite[r]["ckpt-resumed"]["steps"] == 3
    state = suite[0]["ckpt-state"]
    assert state["step"] == 3
    # the servers' optimizer state (momentum) of every variable, gathered from the stale servers
    assert set(state["optimizer"]) == set(state["model"])
    assert all("momentum_buffer" in s for s in state["optimizer"].values())


class _EndsWhileAsked:
    """A server thread that ends between the first is_alive() and the next."""

    def __init__(self) -> None:
        self.asked = 0

    def is_alive(self) -> bool:
        self.asked += 1
        return self.asked == 1

    def join(self, timeout: float) -> None:
        pass


def test_a_server_thread_that_ends_while_the_worker_waits_for_it_ends_the_wait():
    # CI, 2026-11-29: a thread ended between two is_alive() scans and next() on the second raised
    # StopIteration, which failed the whole run at its last step
    from distlab.runtime.stale_ps import StalePS

    ps = object.__new__(StalePS)
    ps._threads, ps.server, ps.timeout, ps.rank = [_EndsWhileAsked()], None, 5.0, 0
    ps._join_servers()
    assert ps._threads[0].asked == 2
