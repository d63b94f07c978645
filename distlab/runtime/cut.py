"""When a run checkpoints: every ``every`` steps in lockstep for synchronous runs; for asynchronous
ones (stale or asynchronous PS, asynchronous gossip) a cut that the fastest rank asks for on its
own clock and every rank joins at its own next step boundary, so no rank waits for another to
reach a step.

Why a cut on request and not one at a step number: a checkpoint needs every rank (a stale PS's
servers hold the values and their optimizers; a window's messages in flight must land), but an
asynchronous run's ranks stand at different steps. Joining "at step k" made each rank wait for
the slowest to reach k, which pulled a run with a persistent straggler into lockstep at every
checkpoint, and once the drift between checkpoints outgrew the group's timeout the fast ranks'
wait failed the run. Joining "now" costs each rank at most the slowest rank's current step and
the store's read interval, whatever the drift. Per-rank snapshots without any collective were the
other choice: they leave a stale PS's server optimizers and a window's mass in flight out of
every file, and a resume would have to stitch ranks' files taken at different times.

The store holds one key: ``""`` (no cut yet), ``"open:N"`` (N cuts asked so far) or
``"closed:N"`` (a rank has done its steps after N cuts: no more are asked, since a finished rank
no longer joins). Asking and closing are ``compare_set`` swaps, so a cut asked just before a rank
closes is still joined by it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

CUT_KEY = "cut"


class StepCadence:
    """A synchronous run's checkpoints: after every ``every`` steps (every rank is at the same
    step, so every rank decides alike without a word)."""

    asynchronous = False

    def __init__(self, every: int | None) -> None:
        self.every = every or 0

    def due(self, steps_done: int) -> bool:
        return bool(self.every) and steps_done % self.every == 0

    def served(self) -> None:
        pass

    def close(self) -> bool:
        return False

    def stop(self) -> bool:
        return True  # every rank stops at the agreed step (StopSignal) and checkpoints there


class CutCadence:
    """An asynchronous run's checkpoints: cut ``n`` is asked by the first rank whose own steps
    pass ``n * every``; every rank joins it at its next step boundary (it reads the store when its
    own clock calls for a cut, else at most every ``interval`` seconds)."""

    asynchronous = True

    def __init__(
        self,
        store: Any,
        every: int | None,
        interval: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.every, self.interval, self.clock = store, every or 0, interval, clock
        self.asked = 0  # cuts asked so far, as this rank last read
        self.joined = 0  # cuts this rank has joined
        self.closed = False
        self._last_read = clock()

    def _read(self) -> str:
        return self.store.get(CUT_KEY).decode() if self.store.check([CUT_KEY]) else ""

    def _swap(self, expected: str, desired: str) -> str:
        return self.store.compare_set(CUT_KEY, expected, desired).decode()

    def _take(self, value: str) -> None:
        state, _, n = value.partition(":")
        self.asked = int(n or 0)
        self.closed = state == "closed"

    def due(self, steps_done: int) -> bool:
        """After this rank's step ``steps_done``: whether it joins a cut now."""
        mine = steps_done // self.every if self.every else 0  # cuts this rank's own clock calls for
        now = self.clock()
        if self.asked > self.joined:
            return True
        if self.closed or (mine <= self.asked and now - self._last_read < self.interval):
            return False
        self._last_read = now
        value = self._read()
        self._take(value)
        if not self.closed and mine > self.asked:
            self._take(self._swap(value, f"open:{self.asked + 1}"))  # lost a race: read what won
        return self.asked > self.joined

    def served(self) -> None:
        self.joined += 1

    def close(self) -> bool:
        """This rank has done its steps: no cut is asked after this. Returns whether a cut asked
        before must still be joined (its askers wait for this rank)."""
        value = self._read()
        while not value.startswith("closed"):  # a failed swap returns what won: try again on it
            value = self._swap(value, f"closed:{value.partition(':')[2] or '0'}")
        self._take(value)
        return self.asked > self.joined

    def stop(self) -> bool:
        """A stop (a cancel, a resize) asks one last cut and closes at once; returns whether this
        rank joins it now (False when it has already joined it)."""
        value = self._read()
        while not value.startswith("closed"):
            value = self._swap(value, f"closed:{int(value.partition(':')[2] or 0) + 1}")
        self._take(value)
        return self.asked > self.joined


def checkpoint_cadence(store: Any, every: int | None, asynchronous: bool) -> StepCadence | CutCadence:
    """The cadence of a run's checkpoints (``every`` steps; None: only at a stop)."""
    return CutCadence(store, every) if asynchronous else StepCadence(every)
