"""One-sided windows (runtime/window.py) and asynchronous gossip (runtime/async_gossip.py) in real
gloo process groups: every window operation's arithmetic, the mutex, the errors, push-sum's exact
average with ranks at uneven paces, and asynchronous training through the trainer."""

from __future__ import annotations

import pytest
import torch
from runtime_bodies import dense_model
from window_bodies import AVERAGING_STEPS, async_ends_body
from window_bodies import GOSSIP_WORLD as WORLD

from distlab.runtime.async_gossip import MASS_FLOOR, step_scale
from distlab.runtime.spawn import spawn_local


@pytest.fixture(scope="module")
def windows(gossip_ranks):
    """window_bodies.window_body's results per rank (conftest.py spawns the ranks)."""
    return [r["windows"] for r in gossip_ranks]


@pytest.fixture(scope="module")
def trained(gossip_ranks):
    """window_bodies.async_gossip_body's results per rank."""
    return [r["async"] for r in gossip_ranks]


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
def test_put_overwrites_accumulate_adds_update_combines_and_versions_count(windows):
    for r in range(WORLD):
        left = (r - 1) % WORLD
        versions, buf = windows[r]["put"]
        assert versions == {left: 2}  # two puts landed; the second overwrote the first
        assert torch.equal(buf, torch.full((5,), 0.5 * left))
        assert torch.allclose(windows[r]["update"], torch.full((5,), 0.25 * r + 0.75 * 0.5 * left))
        assert windows[r]["version after update"] == {left: 0}
        acc, acc_versions = windows[r]["accumulate"]
        assert torch.equal(acc, torch.full((3,), 1.0 + 2.0 * 2.0)) and acc_versions == {left: 2}
        # get fetched the in-neighbour's value after its update
        assert torch.allclose(windows[r]["get"], windows[left]["update"])


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
def test_an_update_under_the_mutex_waits_for_the_remote_holder(windows):
    assert windows[1]["mutex wait"] >= 0.45


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
@pytest.mark.parametrize(
    "case,words",
    [
        ("twice", "used twice"),
        ("sum", "sum to 1.2"),
        ("not out", "not an out-neighbour"),
        ("push-sum put", "push-sum sends with accumulate"),
        ("push-sum weights", "sum to 0.7"),
        ("push-sum no mass", "self_weight > 0"),
        ("push-sum update", "update_then_collect"),
        ("no in-neighbour", "no in-neighbour"),
        ("push-sum get", "count it twice"),
        ("push-sum copies", "zero_init=True"),
    ],
)
def test_bad_window_calls_get_one_line_naming_the_window_and_the_fix(windows, case, words):
    for r in range(WORLD):
        msg = windows[r]["errors"][case]
        assert msg is not None and words in msg and "\n" not in msg, (case, msg)
        assert msg.startswith("window '")


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
def test_a_remote_mutex_wait_that_times_out_says_so_and_leaves_the_owners_queue(windows):
    waiter = windows[2]["mutex timeout"]
    assert waiter["error"] is not None and "waited 2 s for rank 1's mutex" in waiter["error"], waiter
    assert "\n" not in waiter["error"] and 1.9 < waiter["gave up after"] < 2.8, waiter
    # rank 0 let go at 3 s: rank 2's later lock is granted at once, and nobody is left queued
    assert waiter["took it in"] < 1.0, waiter
    owner = windows[1]["mutex timeout"]
    assert owner["queue"] == [] and owner["holder"] is None, owner


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
def test_push_sum_reaches_the_exact_average_at_uneven_paces_and_conserves_mass(windows):
    x0 = [windows[r]["push-sum"]["x0"] for r in range(WORLD)]
    mean = sum(x0) / WORLD
    errors = [(windows[r]["push-sum"]["value"] - mean).abs().max().item() for r in range(WORLD)]
    assert max(errors) < 1e-6, errors
    assert sum(windows[r]["push-sum"]["p"] for r in range(WORLD)) == pytest.approx(WORLD, abs=1e-9)
    total = sum(windows[r]["push-sum"]["z"] for r in range(WORLD))
    assert torch.allclose(total, sum(x0), atol=1e-9)
    start = max((x - mean).abs().max().item() for x in x0)
    assert start > 1.0  # the ranks did start apart


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
def test_windows_on_a_directed_graph_outlive_the_group_timeout(windows):
    # each receiver thread's wait is bounded by the timeout: the heartbeats keep every pair alive
    for r in range(WORLD):
        seconds, p, threads = windows[r]["outlived the timeout"]
        assert seconds >= 5.0 and threads == []
    assert sum(windows[r]["outlived the timeout"][1] for r in range(WORLD)) == pytest.approx(WORLD)


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
def test_no_receiver_thread_outlives_its_windows(windows):
    for r in range(WORLD):
        assert windows[r]["threads after finish"] == [] and windows[r]["push-sum threads"] == []


def _initial_mean() -> dict[str, torch.Tensor]:
    states = [dense_model(seed=100 + r).state_dict() for r in range(WORLD)]
    return {k: sum(s[k] for s in states) / WORLD for k in states[0]}


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
@pytest.mark.parametrize("key", ["push_sum exp2", "push_sum one_peer_exp2", "average exp2"])
def test_asynchronous_averaging_through_the_trainer_reaches_consensus_with_a_slow_rank(trained, key):
    mean = _initial_mean()
    start = dense_model(seed=100).state_dict()
    spread = sum(((start[k] - mean[k]) ** 2).sum().item() for k in mean)
    got = trained[0][key]
    # What the bound tells apart: a run that mixes from one that does not (never mixing leaves
    # the distance at the spread, 1.0x). It is 100x below that, not tighter, because the fast
    # ranks stop mixing by design when they finish their steps, at about half the slow rank's
    # (docs/async-gossip.md), and how much mixing the ranks' overlap allows depends on the host
    # (lr is 0: nothing drifts, what is left is mass that never met): under 1e-4 x the spread on 2
    # cores, 2.4e-3 on a 16-core H100 host (read off that session's console; no file was kept).
    # The bound was 1e-3 until that host measured 2.4e-3. Runs of 30 steps (60-120 ms) ended at
    # 0.06-0.09 x in two whole-suite runs here: window_bodies.AVERAGING_STEPS says why it is 300.
    assert got["distance"] < 1e-2 * spread, (got["distance"], spread)
    heard_any = False
    for r in range(WORLD):
        recs = trained[r][key]["records"]
        assert [rec["clock"] for rec in recs] == list(range(1, AVERAGING_STEPS + 1))  # each rank's own steps
        assert all("heard" in rec for rec in recs)
        measured = [rec["clock"] for rec in recs if "disagreement" in rec]
        # every eighth clock (it costs passes over the model), when a neighbour was heard from
        assert set(measured) <= set(range(1, AVERAGING_STEPS + 1, 8)), measured
        heard_any = heard_any or bool(measured)
        assert ("weight" in recs[-1]) == key.startswith("push_sum")
    assert heard_any
    if key.startswith("push_sum"):  # push-sum keeps the average; neighbour averaging need not
        err = max((trained[0][key]["weights"][k] - mean[k]).abs().max().item() for k in mean)
        assert err < 0.05 * spread**0.5


@pytest.mark.slow
@pytest.mark.timeout(600)  # the first test waits for conftest.py's spawn
@pytest.mark.parametrize(
    "case", ["gossip:exp2:push_sum", "gossip:exp2:average", "gossip:one_peer_exp2:push_sum"]
)
def test_asynchronous_gossip_learns_digits(trained, case):
    def rank_mean(c: str, part: slice) -> float:
        return float(sum(trained[r]["digits"][c]["losses"][part].mean() for r in range(WORLD)) / WORLD)

    first, last = rank_mean(case, slice(0, 5)), rank_mean(case, slice(-15, None))
    ar = rank_mean("allreduce", slice(-15, None))
    # a fast rank's steps are the optimizer's x step_scale(p) / p: unscaled, p fell to 0.08 here,
    # steps grew 12x, and one rank's loss could stall (2.31 -> 1.92 in a CI run)
    assert last < 0.35 * first, (first, last)
    assert last < ar + 0.4, (last, ar)  # asynchronous and unsynchronised replicas: looser than sync gossip


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_asynchronous_run_checkpoints_resumes_and_stops_cleanly(tmp_path):
    res = spawn_local(2, async_ends_body, str(tmp_path), timeout=200)
    for r in range(2):
        ckpt = res[r]["checkpoint"]
        assert ckpt["resumed_steps"] == [2, 3] and ckpt["samples"] == 16
        # a checkpoint is a consistent cut, not a barrier to equal replicas: the resumed run
        # starts every rank from rank 0's saved values and ends near the uninterrupted run
        err = max((ckpt["full"][k] - ckpt["resumed"][k]).abs().max().item() for k in ckpt["full"])
        assert err < 0.1, err
        stop = res[r]["stop"]
        assert stop["stopped"] and 3 <= stop["steps"] < 50  # at or past the agreed step, never all 50
        assert res[r]["threads"] == []
    assert res[0]["checkpoint"]["checkpoint"].endswith("ckpt-000000004.pt")


def test_push_sum_scales_its_steps_below_the_floor_so_they_move_it_at_most_twice_the_optimizer_s():
    assert step_scale(1.0) == 1.0 and step_scale(MASS_FLOOR) == 1.0 and step_scale(2.5) == 1.0
    assert step_scale(0.25) == pytest.approx(0.25 / MASS_FLOOR) and step_scale(0.0) == 0.0
    for p in (0.01, 0.08, 0.3, 0.5, 0.9, 1.7):  # the parameters move by the step x scale / p
        assert step_scale(p) / p <= 1 / MASS_FLOOR + 1e-12
