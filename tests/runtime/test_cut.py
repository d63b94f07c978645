"""The checkpoint cadence of asynchronous runs (runtime/cut.py) on a real TCPStore: a cut is asked
on the fastest rank's clock and joined by every rank at its own step, every rank joins the same
cuts (each is a collective), and none is asked after a rank has finished."""

from __future__ import annotations

import datetime
import random
import threading
import time

import pytest
import torch.distributed as dist

from distlab.runtime.cut import CutCadence, StepCadence, TimedCutCadence, checkpoint_cadence


@pytest.fixture
def store():
    s = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    return dist.PrefixStore("run/", s)


def test_a_cut_is_asked_by_the_fastest_rank_and_joined_where_each_rank_stands(store):
    fast, slow = CutCadence(store, 4, interval=0), CutCadence(store, 4, interval=0)
    assert [fast.due(k) for k in (1, 2, 3)] == [False, False, False]
    assert fast.due(4)  # its own clock asks cut 1
    assert slow.due(2)  # the slow rank joins at its step 2, not at 4
    fast.served(), slow.served()
    assert not slow.due(3) and not slow.due(4)  # its clock reaching 4 asks nothing: cut 1 was it
    assert fast.due(8)  # cut 2
    fast.served()
    slow.close()
    assert slow.pending()  # finished before it joined cut 2: it must still join (the asker waits)
    slow.served()
    assert not fast.due(9) and not fast.due(12)  # closed: a finished rank joins no more cuts
    fast.close()
    assert not fast.pending()


def test_a_stop_asks_one_last_cut_that_every_rank_joins_once(store):
    a, b = CutCadence(store, 100, interval=0), CutCadence(store, 100, interval=0)
    a.stop()
    assert a.pending()
    a.served()
    assert b.due(1)  # b joins it at its next step
    b.served()
    b.stop(), b.close(), a.close()
    assert not b.pending() and not a.pending()


def test_a_stop_on_a_rank_that_has_not_read_a_pending_cut_joins_both(store):
    """The fast rank asked cut 1 and waits in it; the slow rank, between its reads of the store,
    is stopped: it must join cut 1 and the stop's cut 2, as the fast rank will, or the fast rank
    would wait alone in cut 2's collective until the timeout."""
    fast, slow = CutCadence(store, 4, interval=0), CutCadence(store, 4, interval=60)
    assert fast.due(4)
    assert not slow.due(1)  # within its read interval: it has not seen cut 1
    slow.stop()
    joined = 0
    while slow.pending():
        slow.served()
        joined += 1
    fast.served()  # cut 1, with the slow rank's first
    assert fast.due(5)  # then the stop's cut, with the slow rank's second
    fast.served()
    assert joined == 2 and not fast.pending() and not fast.due(8)


def test_a_resumed_run_counts_its_cuts_from_where_it_resumed(store):
    c = CutCadence(store, 10, start_step=30, interval=0)
    assert [c.due(k) for k in (31, 32, 33, 39)] == [False] * 4  # not a cut at every step
    assert c.due(40)


def test_a_synchronous_run_checkpoints_every_k_steps_and_once_at_a_stop():
    c = checkpoint_cadence(None, 3, asynchronous=False)
    assert isinstance(c, StepCadence)
    assert [c.due(k) for k in range(1, 7)] == [False, False, True, False, False, True]
    c.close()
    assert not c.pending()
    c.stop()
    assert c.pending()
    c.served()
    assert not c.pending()


@pytest.mark.timeout(60)
def test_ranks_at_their_own_pace_join_the_same_cuts_and_never_wait_for_a_step(store):
    """Four threads, one 5x slower than the rest, joining each cut through a real barrier (as the
    trainer's collectives): every thread joins the same cuts, and the fast ones join them at
    steps far ahead of the slow one (the old cadence, a step number, would have made them wait)."""
    world, steps = 4, 40
    barrier = threading.Barrier(world, timeout=10)
    joined: list[list[int]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        rng = random.Random(r)
        cad = CutCadence(store, 8, interval=0.005)
        try:
            for step in range(steps):
                time.sleep((0.010 if r == world - 1 else 0.002) * rng.uniform(0.8, 1.2))
                if cad.due(step + 1):
                    barrier.wait()
                    joined[r].append(step + 1)
                    cad.served()
            cad.close()
            while cad.pending():
                barrier.wait()
                joined[r].append(steps)
                cad.served()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(50)
    assert not errors, errors
    counts = {len(j) for j in joined}
    assert len(counts) == 1 and counts.pop() >= 2, joined  # the same cuts on every rank
    # at each cut the fastest rank stood well ahead of the slow one: no one waited for a step
    assert any(joined[0][i] >= 2 * joined[-1][i] for i in range(len(joined[0]))), joined


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_asynchronous_run_s_default_cuts_are_timed_by_their_cost(store):
    clock = Clock()
    fast = TimedCutCadence(store, 4, 0.01, interval=0, estimate=lambda: 0.02, clock=clock)
    slow = TimedCutCadence(store, 4, 0.01, interval=0, estimate=lambda: 0.02, clock=clock)
    clock.now = 1.0
    assert not fast.due(4)  # its steps are there, but 0.02 s at 1% of the run's time needs 2 s
    clock.now = 2.0
    assert not fast.due(3) and fast.due(4)  # 4 steps and 2 s: cut 1
    assert slow.due(1)  # the slow rank joins it where it stands, whatever its own clock says
    fast.served(), slow.served()
    fast.measured(4, 0.5), slow.measured(1, 0.5)  # a cut of 0.5 s: the next 50 s later
    clock.now = 40.0
    assert not fast.due(20) and not slow.due(10)
    clock.now = 52.0
    assert not fast.due(7)  # the time has passed, not 4 steps since its cut
    assert fast.due(8)
    fast.served(), slow.due(11), slow.served()
    fast.measured(8, 10.0)  # a costly cut: the next at most `longest` (300 s) later
    clock.now = 52.0 + 299.0
    assert not fast.due(100)
    clock.now = 52.0 + 301.0
    assert fast.due(101)


def test_the_default_cadence_of_an_asynchronous_run_is_timed_and_a_given_count_is_kept(store):
    assert isinstance(checkpoint_cadence(store, 10, True, budget=0.01), TimedCutCadence)
    fixed = checkpoint_cadence(store, 10, True)  # checkpoint_every=10: every tenth step, as asked
    assert type(fixed) is CutCadence
