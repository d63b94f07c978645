"""How ranks agree on the step to stop at (runtime/process_group.StopSignal), on a real torch store.

Two ranks in lockstep share a ``HashStore``; the clock is the test's, so a "slow" step costs no time.
Only rank 0 is told to stop (the request reached it first): both must stop at the same step."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from distlab.runtime.process_group import STOP_KEY, StopSignal


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stops(step_seconds: list[float], request_at: int, skew: int = 0) -> tuple[int, int]:
    """Run two ranks step by step (rank 1 ``skew`` steps ahead) until both stop; rank 0 is asked
    to stop from step ``request_at`` on. Returns the step each stopped before."""
    store, clock = dist.HashStore(), Clock()
    asked = [False]
    ranks = [
        StopSignal(store, lambda: asked[0], margin=2, clock=clock),
        StopSignal(store, lambda: False, margin=2, clock=clock),
    ]
    stopped: list[int | None] = [None, None]
    for step in range(len(step_seconds)):
        asked[0] = step >= request_at
        order = [(1, step + skew), (0, step)] if skew else [(0, step), (1, step)]
        for rank, at in order:
            if stopped[rank] is None and at < len(step_seconds) and ranks[rank].stop_before(at):
                stopped[rank] = at
        if None not in stopped:
            return stopped[0], stopped[1]
        clock.now += step_seconds[step]
    raise AssertionError(f"the ranks did not both stop: {stopped}")


@pytest.mark.parametrize("skew", [0, 1])
def test_fast_steps_stop_together_after_the_margin_and_the_read_period(skew):
    # the read of every fourth step is answered at the next step's boundary: one step more
    a, b = _stops([0.01] * 40, request_at=9, skew=skew)
    assert a == b == 9 + 2 + 4 + 1


@pytest.mark.parametrize("skew", [0, 1])
def test_slow_steps_stop_together_one_step_after_the_margin(skew):
    """Steps of 1 s: every rank reads the store each step, so a cancel waits 3 steps, not 6."""
    a, b = _stops([1.0] * 40, request_at=9, skew=skew)
    assert a == b == 9 + 2 + 1


def test_one_slow_step_among_fast_ones_keeps_the_long_margin():
    """A hiccup on the rank that writes must not shorten the margin: the other rank, back to fast
    steps, reads only every fourth step and would miss a nearer stop."""
    seconds = [0.01] * 40
    seconds[8] = 1.0
    a, b = _stops(seconds, request_at=9)
    assert a == b == 9 + 2 + 4 + 1


def test_without_a_stop_request_nothing_stops():
    store, clock = dist.HashStore(), Clock()
    signal = StopSignal(store, lambda: False, margin=2, clock=clock)
    for step in range(20):
        assert not signal.stop_before(step)
        clock.now += 1.0
    assert not signal.requested()


class _Broken:
    """A store whose reads fail, as a run's store does once its server is gone."""

    def check(self, keys):
        raise RuntimeError("store gone")


def test_a_read_beside_the_step_that_fails_raises_at_the_next_step_boundary():
    clock = Clock()
    signal = StopSignal(_Broken(), lambda: False, margin=2, clock=clock)
    assert not signal.stop_before(0)  # a periodic step: the read goes to the reader thread
    clock.now += 0.01
    with pytest.raises(RuntimeError, match="store gone"):
        signal.stop_before(1)


def test_the_reader_thread_ends_when_idle_and_the_next_read_starts_another():
    store, clock = dist.HashStore(), Clock()
    signal = StopSignal(store, lambda: False, margin=2, clock=clock)
    signal.READER_IDLE = 0.05
    assert not signal.stop_before(0)
    first = signal._reader
    assert first is not None
    first.join(timeout=5)
    assert not first.is_alive() and signal._reader is None
    store.set(STOP_KEY, "9")
    known, stopped = None, None
    for step in range(1, 12):
        clock.now += 0.01
        if signal.stop_before(step) and stopped is None:
            stopped = step
        if known is None and signal.target is not None:
            known = step
    assert (known, stopped) == (5, 9)  # read at step 4 by a new reader, answered at step 5


def test_close_ends_the_reader_thread_at_once():
    clock = Clock()
    signal = StopSignal(dist.HashStore(), lambda: False, margin=2, clock=clock)
    assert not signal.stop_before(0)
    reader = signal._reader
    assert reader is not None
    signal.close()
    reader.join(timeout=1.0)  # far below READER_IDLE (5 s)
    assert not reader.is_alive()


def test_a_read_its_reader_ended_without_answering_is_made_at_the_boundary_not_waited_for():
    store, clock = dist.HashStore(), Clock()
    signal = StopSignal(store, lambda: False, margin=2, clock=clock)
    signal.close()
    # as a reader closed between the ask and its read leaves it: asked, no answer, no reader
    signal._asked, signal._answer, signal._reader = True, None, None
    store.set(STOP_KEY, "3")
    signal.stop_before(1)  # a wait for the answer would hang here
    assert signal.target == 3


def test_an_asynchronous_run_reads_on_its_own_thread_and_stops_where_it_stands():
    # a read beside the step would answer from a later store, and a rank behind would stop a step
    # later or earlier than where it stood when it read (CI-like run, 2026-11-29: 1 step, not >= 3)
    store, clock = dist.HashStore(), Clock()
    store.set(STOP_KEY, "9")
    signal = StopSignal(store, lambda: False, margin=2, clock=clock, at_once=True)
    assert signal.stop_before(0) and signal._reader is None
