"""``lab.adapt(minimum, maximum)``: the cluster size a shared Lab's scheduler asks for after each round.

As Dask's ``cluster.adapt``, but the target comes from the scheduler's jobs rather than task
queues: grow by what the waiting runs need at least (a run that got no workers), or by one when
every running run would speed up with one more worker (its speedup, measured or linear, above
``GAIN`` times its current one; Pollux's utility: a worker helps only if every job gains); shrink
by the workers no run held for ``IDLE_ROUNDS`` rounds in a row. Always within [minimum, maximum].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from distlab.errors import SchedulerError
from distlab.sched.policy import JobSpec

GAIN = 1.1  # one more worker must speed a run up by 10%: below that a resize costs more than it gives
IDLE_ROUNDS = 2  # rounds a worker stays unused before it is retired (a run ending frees it only briefly)


def adapt_target(
    specs: Sequence[JobSpec],
    held: dict[str, int],
    have: int,
    idle_rounds: int,
    minimum: int,
    maximum: int,
) -> int:
    """Workers wanted next: ``specs`` the live runs, ``held`` the workers each holds now (by name),
    ``have`` the cluster's workers, ``idle_rounds`` how many rounds some workers stood unused."""
    waiting = [s for s in specs if held.get(s.name, 0) == 0]
    running = [s for s in specs if held.get(s.name, 0) > 0]
    used = sum(held.values())
    if waiting:
        want = have + sum(max(s.min_replicas, 1) for s in waiting) - (have - used)
    elif running and all(_gains(s, held[s.name]) for s in running):
        want = have + 1
    elif used < have and idle_rounds >= IDLE_ROUNDS:
        want = used
    else:
        want = have
    return int(min(max(want, minimum), maximum))


def _gains(spec: JobSpec, now: int) -> bool:
    if now >= spec.max_replicas:
        return False
    ones = np.ones(1, dtype=int)
    before, after = spec.speedups(ones, np.array([now])), spec.speedups(ones, np.array([now + 1]))
    return bool(after[0] > GAIN * before[0])


def check_adapt(scheduler: Any, minimum: int, maximum: int) -> Any:
    """``lab.adapt``'s checks; the scheduler, its range set."""
    if scheduler is None:
        raise SchedulerError(
            "lab.adapt: a Lab without a scheduler runs one run at a time; start it as "
            "dl.Lab(..., scheduler='goodput') (or 'fifo') to let its size follow its runs"
        )
    for name, n in (("minimum", minimum), ("maximum", maximum)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SchedulerError(f"lab.adapt: {name}={n!r}; give a whole number of workers, at least 1")
    if minimum > maximum:
        raise SchedulerError(f"lab.adapt: minimum={minimum} is above maximum={maximum}; swap them")
    scheduler.adapt_range = (minimum, maximum)
    return scheduler
