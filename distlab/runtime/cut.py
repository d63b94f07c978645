"""When a run checkpoints: in lockstep for synchronous runs (every ``every`` steps, or by default
timed by each checkpoint's measured cost: ``TimedCadence``); for asynchronous
ones (asynchronous PS, asynchronous gossip) a cut that the fastest rank asks for on its own clock
(by default timed by its cuts' measured cost: ``TimedCutCadence``) and every rank joins at its own
next step boundary, so no rank waits for another to reach a step;
and where an asynchronous run's ranks meet at its end (``EndRendezvous``).

Why a cut on request and not one at a step number: a checkpoint needs every rank (a PS's
servers hold the values and their optimizers; a window's messages in flight must land), but an
asynchronous run's ranks stand at different steps. Joining "at step k" made each rank wait for
the slowest to reach k, which pulled a run with a persistent straggler into lockstep at every
checkpoint, and once the drift between checkpoints outgrew the group's timeout the fast ranks'
wait failed the run. Joining "now" costs each rank at most the slowest rank's current step and
the store's read interval, whatever the drift. Per-rank snapshots without any collective were the
other choice: they leave a PS's server optimizers and a window's mass in flight out of every
file, and a resume would have to stitch ranks' files taken at different times.

The store holds one key: ``""`` (no cut yet), ``"open:N"`` (N cuts asked so far) or
``"closed:N"`` (a rank has done its steps, or a stop asked the last cut: no more are asked, since
a finished rank no longer joins). Asking and closing are ``compare_set`` swaps, so a cut asked
just before a rank closes is still joined by it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from distlab.errors import LaunchError

CUT_KEY = "cut"


class StepCadence:
    """A synchronous run's checkpoints: after every ``every`` steps (every rank is at the same
    step, so every rank decides alike without a word), and one at an agreed stop."""

    asynchronous = False

    def __init__(self, every: int | None) -> None:
        self.every = every or 0
        self._stop = False

    def due(self, steps_done: int) -> bool:
        return bool(self.every) and steps_done % self.every == 0

    def served(self) -> None:
        self._stop = False

    def close(self) -> None:
        pass

    def stop(self) -> None:
        self._stop = True  # every rank stops at the agreed step (StopSignal) and checkpoints there

    def pending(self) -> bool:
        return self._stop


class TimedCadence(StepCadence):
    """A synchronous run's default cadence, timed by what a checkpoint costs: after ``every``
    steps the ranks agree (one all-reduce: the maximum over ranks, ``agree``) on an estimate of
    a checkpoint's cost (``estimate``: its bytes at this machine's rate, ``resume.py``) and on
    their step time, and take the first checkpoint at the step that keeps checkpoints within
    ``budget`` of the run's time; after each one, the next from its measured cost. Never sooner
    than ``every`` steps apart, never more than ``longest`` seconds. A checkpoint at every tenth
    of a run cost a 40 MB model the same whatever its share of a 5 ms step, and a 420 MB model
    1.7 s of CPU each (0.2 s to snapshot on the training thread, 1.5 s to serialise, hash and
    write beside it, on cores the ranks train on). A stop (a resize) still checkpoints at once."""

    def __init__(
        self,
        every: int,
        budget: float,
        agree: Callable[[float, float], tuple[float, float]],
        start_step: int = 0,
        longest: float = 300.0,
        estimate: Callable[[], float] = lambda: 0.0,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        super().__init__(every)
        self.budget, self.agree, self.longest, self.estimate, self.clock = (
            budget,
            agree,
            longest,
            estimate,
            clock,
        )
        self.start = start_step
        self.next: int | None = None  # planned once the first ``every`` steps are timed
        self._began = clock()

    def due(self, steps_done: int) -> bool:
        if self.next is None:
            if steps_done < self.start + self.every:
                return False
            step_time = (self.clock() - self._began) / max(1, steps_done - self.start)
            self.next = self._after(self.start, *self.agree(self.estimate(), step_time))
        return steps_done >= self.next

    def measured(self, steps_done: int, cost: float, step_time: float) -> int:
        """After the checkpoint at ``steps_done`` that cost ``cost`` s beside steps of
        ``step_time`` s on this rank: the step of the next one (the same on every rank)."""
        self.next = self._after(steps_done, *self.agree(cost, step_time))
        return self.next

    def _after(self, step: int, cost: float, step_time: float) -> int:
        step_time = max(step_time, 1e-6)
        spaced = math.ceil(cost / (self.budget * step_time))
        return step + max(1, min(max(self.every, spaced), int(self.longest / step_time)))


class CutCadence:
    """An asynchronous run's checkpoints: cut ``n`` is asked by the first rank whose own steps
    since the run (re)started pass ``n * every``; every rank joins it at its next step boundary
    (it reads the store when its own clock calls for a cut, else at most every ``interval``
    seconds). ``start_step``: where this run resumed (the store, and so the count, is new)."""

    asynchronous = True

    def __init__(
        self,
        store: Any,
        every: int | None,
        start_step: int = 0,
        interval: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.every, self.interval, self.clock = store, every or 0, interval, clock
        self.base = start_step // self.every if self.every else 0
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

    def _wants(self, steps_done: int, now: float) -> int:
        """How many cuts this rank's own clock calls for after its step ``steps_done``."""
        return steps_done // self.every - self.base if self.every else 0

    def due(self, steps_done: int) -> bool:
        """After this rank's step ``steps_done``: whether it joins a cut now."""
        now = self.clock()
        mine = self._wants(steps_done, now)
        if self.pending():
            return True
        if self.closed or (mine <= self.asked and now - self._last_read < self.interval):
            return False
        self._last_read = now
        value = self._read()
        self._take(value)
        if not self.closed and mine > self.asked:
            self._take(self._swap(value, f"open:{self.asked + 1}"))  # lost a race: read what won
        return self.pending()

    def served(self) -> None:
        self.joined += 1

    def pending(self) -> bool:
        """A cut asked that this rank has not joined (its askers wait for it)."""
        return self.asked > self.joined

    def close(self) -> None:
        """This rank has done its steps: no cut is asked after this (``pending`` says whether one
        asked before must still be joined)."""
        self._end(0)

    def stop(self) -> None:
        """A stop (a cancel, a resize) asks one last cut and closes. A cut asked before that this
        rank has not read yet stays pending too: ``pending`` until both are joined."""
        self._end(1)

    def _end(self, more: int) -> None:
        value = self._read()
        while not value.startswith("closed"):  # a failed swap returns what won: try again on it
            value = self._swap(value, f"closed:{int(value.partition(':')[2] or 0) + more}")
        self._take(value)


class TimedCutCadence(CutCadence):
    """An asynchronous run's default cadence, timed by what its cuts cost: a rank's own clock calls
    for the next cut once it has done ``every`` steps since the last it joined (or since the run
    (re)started) and the time since then pays for the cut within ``budget`` of the run's time:
    ``estimate`` (its bytes at this machine's rates) for the first, then the cost this rank
    measured for the last (``measured``: its wait for the other ranks and its snapshot); never more
    than ``longest`` seconds apart. Every ``max(10, steps // 10)`` steps, the count this replaced,
    made push-sum's 80-step runs on 4 ranks 21% longer (1.46 s against 1.20; a cut waits for every
    rank's step boundary and for the messages in flight): 1.03 of synchronous gossip's time to its
    target against 0.83 with no checkpoint (datasets/measurements/async-gossip-2026-11-29-elastic)."""

    def __init__(
        self,
        store: Any,
        every: int,
        budget: float,
        start_step: int = 0,
        interval: float = 0.02,
        longest: float = 300.0,
        estimate: Callable[[], float] = lambda: 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(store, every, start_step, interval, clock)
        self.budget, self.longest, self.estimate = budget, longest, estimate
        self._next_step = start_step + self.every
        self._next_time: float | None = None  # the first: from the estimate, once it is first needed
        self._began = clock()

    def _wants(self, steps_done: int, now: float) -> int:
        if steps_done < self._next_step:
            return self.asked
        if self._next_time is None:
            self._next_time = self._began + self._gap(self.estimate())
        return self.asked + 1 if now >= self._next_time else self.asked

    def _gap(self, cost: float) -> float:
        return min(max(cost, 0.0) / self.budget, self.longest)

    def measured(self, steps_done: int, cost: float) -> None:
        """This rank joined a cut after its step ``steps_done`` and it cost ``cost`` seconds: its
        clock calls for the next one ``every`` steps and ``cost / budget`` seconds later."""
        self._next_step = steps_done + self.every
        self._next_time = self.clock() + self._gap(cost)


def checkpoint_cadence(
    store: Any,
    every: int | None,
    asynchronous: bool,
    start_step: int = 0,
    budget: float | None = None,
    agree: Callable[[float, float], tuple[float, float]] | None = None,
    estimate: Callable[[], float] = lambda: 0.0,
) -> StepCadence | CutCadence:
    """The cadence of a run's checkpoints (``every`` steps; None: only at a stop); ``budget``: the
    checkpoints timed by their cost (``TimedCadence``; asynchronous, ``TimedCutCadence``)."""
    if asynchronous:
        if budget and every:
            return TimedCutCadence(store, every, budget, start_step, estimate=estimate)
        return CutCadence(store, every, start_step)
    if budget and every and agree is not None:
        return TimedCadence(every, budget, agree, start_step, estimate=estimate)
    return StepCadence(every)


class EndRendezvous:
    """An asynchronous run's ranks meet at the end through the store, with no collective: each
    rank posts its step now and then, and a rank that has done its steps waits until every rank
    has, for as long as some rank's step keeps moving. The run's last collectives (the servers'
    final broadcast, the consensus distance) come after it: a collective waits under the group's
    timeout, and a straggler far behind would fail the fast ranks there."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world: int,
        timeout: float,
        failed: Callable[[], tuple[int, str] | None],
        every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.rank, self.world, self.timeout = store, rank, world, timeout
        self.failed, self.every, self.clock = failed, every, clock
        self._posted = -every

    def progress(self, step: int) -> None:
        """(each step) This rank's step, posted at most every ``every`` seconds."""
        now = self.clock()
        if now - self._posted >= self.every:
            self._posted = now
            self.store.set(f"pace/{self.rank}", str(step))

    def wait(self, poll: float = 0.1) -> None:
        """This rank has done its steps: wait for every other rank to have done theirs."""
        self.store.set(f"end/{self.rank}", "1")
        ends = [f"end/{r}" for r in range(self.world)]
        seen: dict[int, str] = {}
        deadline = self.clock() + self.timeout
        while not self.store.check(ends):
            if (other := self.failed()) is not None:
                raise LaunchError(f"rank {self.rank}: stopped because rank {other[0]} failed: {other[1]}")
            for r in range(self.world):
                key = f"pace/{r}"
                if r != self.rank and self.store.check([key]):
                    step = self.store.get(key).decode()
                    if seen.get(r) != step:
                        seen[r], deadline = step, self.clock() + self.timeout
            if self.clock() > deadline:
                late = [r for r in range(self.world) if not self.store.check([f"end/{r}"])]
                raise LaunchError(
                    f"rank {self.rank}: done with its steps, it heard no progress from rank(s) {late} "
                    f"for {self.timeout:g} s; raise lab.launch(timeout=) if their steps take that long"
                )
            time.sleep(poll)
