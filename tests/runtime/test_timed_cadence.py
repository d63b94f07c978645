"""A synchronous run's default checkpoint cadence: timed by each checkpoint's measured cost."""

from __future__ import annotations

from distlab.runtime.cut import StepCadence, TimedCadence, checkpoint_cadence


def test_the_first_checkpoint_is_planned_after_every_steps_from_an_estimate_and_the_next_from_its_cost():
    seen = []
    now = [0.0]

    def agree(cost, step_time):  # the other rank measured a slower checkpoint: every rank takes the max
        seen.append((cost, step_time))
        return max(cost, 0.5), step_time

    c = TimedCadence(every=10, budget=0.01, agree=agree, estimate=lambda: 0.02, clock=lambda: now[0])
    now[0] = 1.0  # ten steps of 0.1 s
    assert not any(c.due(s) for s in range(1, 10)) and seen == []
    # at step 10 the ranks agree on the estimate (0.5 s, the other rank's) and their step time:
    # 1% of the run means the first checkpoint at step 500, not at 10
    assert not c.due(10) and seen == [(0.02, 0.1)] and c.next == 500
    assert not c.due(499) and c.due(500)
    assert c.measured(500, 0.2, 0.1) == 1000 and seen[-1] == (0.2, 0.1)  # then from what it cost


def test_never_sooner_than_the_first_interval_nor_further_apart_than_five_minutes():
    cheap = TimedCadence(every=10, budget=0.01, agree=lambda c, t: (c, t), clock=lambda: 0.0)
    assert cheap.due(10)  # a checkpoint that costs nothing: the old cadence, every 10 steps
    assert cheap.measured(10, 1e-5, 0.01) == 20
    slow_steps = TimedCadence(every=10, budget=0.01, agree=lambda c, t: (c, t))
    assert slow_steps.measured(10, 30.0, 60.0) == 15  # 60 s steps: at least every 300 s
    resumed = TimedCadence(every=10, budget=0.01, agree=lambda c, t: (c, t), start_step=40)
    assert not resumed.due(49) and resumed.due(50)


def test_which_cadence_a_run_gets():
    agree = lambda c, t: (c, t)  # noqa: E731
    assert isinstance(checkpoint_cadence(None, 10, False, 0, 0.01, agree), TimedCadence)
    assert type(checkpoint_cadence(None, 10, False, 0, None, agree)) is StepCadence  # checkpoint_every given
    assert type(checkpoint_cadence(None, None, False, 0, 0.01, agree)) is StepCadence  # elastic=False
