"""A synchronous run's default checkpoint cadence: timed by each checkpoint's measured cost."""

from __future__ import annotations

from distlab.runtime.cut import StepCadence, TimedCadence, checkpoint_cadence


def test_the_first_checkpoint_comes_after_every_steps_and_the_next_keeps_within_the_budget():
    seen = []

    def agree(cost, step_time):  # the other rank measured a slower checkpoint: every rank takes the max
        seen.append((cost, step_time))
        return max(cost, 0.5), step_time

    c = TimedCadence(every=10, budget=0.01, agree=agree)
    assert [s for s in range(1, 30) if c.due(s)][0] == 10
    # a 0.5 s checkpoint beside 0.1 s steps: 1% means one every 500 steps
    assert c.measured(10, 0.2, 0.1) == 510 and seen == [(0.2, 0.1)]
    assert not c.due(509) and c.due(510)


def test_never_sooner_than_the_first_interval_nor_further_apart_than_five_minutes():
    cheap = TimedCadence(every=10, budget=0.01, agree=lambda c, t: (c, t))
    assert cheap.measured(10, 1e-5, 0.01) == 20  # a checkpoint that costs nothing: the old cadence
    slow_steps = TimedCadence(every=10, budget=0.01, agree=lambda c, t: (c, t))
    assert slow_steps.measured(10, 30.0, 60.0) == 15  # 60 s steps: at least every 300 s
    resumed = TimedCadence(every=10, budget=0.01, agree=lambda c, t: (c, t), start_step=40)
    assert resumed.next == 50


def test_which_cadence_a_run_gets():
    agree = lambda c, t: (c, t)  # noqa: E731
    assert isinstance(checkpoint_cadence(None, 10, False, 0, 0.01, agree), TimedCadence)
    assert type(checkpoint_cadence(None, 10, False, 0, None, agree)) is StepCadence  # checkpoint_every given
    assert type(checkpoint_cadence(None, None, False, 0, 0.01, agree)) is StepCadence  # elastic=False
