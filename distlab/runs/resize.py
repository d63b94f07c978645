"""How a Run changes workers: a queued start on the workers a shared Lab's scheduler gives it, and
the pause at a step with a checkpoint, then the resume on a new set (``lab.scale``, a re-allocation).

A mixin of ``Run`` (runs/run.py), whose driver thread reads the flags these methods set.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from distlab.errors import LaunchError

CANCEL_WITHIN = 10.0  # seconds: every rank stops within this after cancel()


class Resizable:
    """A Run's resize and queued-start half (module docstring); its state lives on the Run."""

    # set by Run.__init__ (runs/run.py)
    id: str
    strategy: Any
    _status: str
    _lock: Any
    _cancel: bool
    _job: Any
    _workers: list[str]
    _threads: list[int]
    _replan: Any
    _done: Any
    _group: Any
    _pausing: bool
    _paused: Any
    _resume: Any
    _resume_with: list[str] | None
    error: Any

    def start(self) -> None:  # Run.start
        raise NotImplementedError

    def _tell_done(self) -> None:  # Run._tell_done
        raise NotImplementedError

    def mark_queued(self) -> None:
        """(a shared Lab) The run waits for workers: ``start_on`` starts it, ``cancel`` removes it."""
        self._status = "queued"

    def plan_with(self, plan: Callable[[list[str]], Any]) -> None:
        """Every re-plan from now (a resume, a queued start, a lost worker's) builds ``plan(workers)``,
        not the launch's strategy: the run changes strategy at its next resume. The checkpoint it
        resumes from is strategy-independent (runtime/optim_state.py: one full-shape optimizer state
        per variable), so it continues at the exact step under the new one."""
        launched = self._replan

        def replan(workers: list[str]) -> tuple[Any, list[int], dict[str, Any]]:
            _, threads, options = launched(workers)
            return plan(list(workers)), threads, options

        self._replan = replan

    def start_on(self, workers: list[str], plan: Callable[[list[str]], Any] | None = None) -> bool:
        """(a shared Lab's scheduler) Start a queued run on ``workers``, re-planned for them (its
        route's re-plan reads them from the run's cluster view; ``plan``: under the strategy
        ``plan(workers)`` builds instead, as ``plan_with``); False when it was cancelled."""
        with self._lock:
            if self._cancel:
                return False
            if plan is not None:
                self.plan_with(plan)
            strategy, threads, options = self._replan(list(workers))
            self.strategy = strategy
            self._job = dataclasses.replace(
                self._job,
                world=len(workers),
                strategy=strategy,
                options=dataclasses.replace(self._job.options, **options),
            )
            self._workers, self._threads = list(workers), list(threads)
            self._status = "pending"
        self.start()
        return True

    def refuse(self, error: Exception) -> None:
        """(a shared Lab's scheduler) A queued run that cannot start on the workers it got ends
        failed with ``error`` (``run.wait()`` raises it)."""
        self.error = error
        self._status = "failed"
        self._done.set()
        self._tell_done()

    def _wait_for_workers(self) -> list[str] | None:
        """(driver) Paused at a checkpoint: wait for ``resume_on``'s workers (None: cancelled)."""
        self._status = "paused"
        self._paused.set()
        while not self._resume.wait(0.2):
            if self._cancel:
                return None
        self._resume.clear()
        self._paused.clear()
        self._pausing = False
        new, self._resume_with = self._resume_with, None
        return new

    def pause(self, timeout: float = CANCEL_WITHIN) -> bool:
        """(Lab.scale) Stop the ranks at a step with a checkpoint written there; True once paused,
        False if the run ended first. ``resume_on(workers)`` continues it."""
        if self._done.is_set():
            return False
        if self._job.checkpoint_dir is None:
            raise LaunchError(
                f"run {self.id}: launched without checkpoints (elastic=False), so it cannot be resized; "
                "launch with elastic=True"
            )
        self._pausing = True
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            group = self._group
            if group is not None and self._status == "running":
                group.stop()
                break
            if self._done.is_set():
                return False
            time.sleep(0.05)
        while time.monotonic() < deadline:
            if self._paused.wait(0.1):
                return True
            if self._done.is_set():
                return False
        raise LaunchError(f"run {self.id}: ranks did not stop within {timeout:g} s for the resize")

    def resume_on(self, workers: list[str], plan: Callable[[list[str]], Any] | None = None) -> None:
        """Continue a paused run on ``workers`` from its checkpoint (the data position exact);
        ``plan``: under the strategy ``plan(workers)`` builds (``plan_with``), else its own re-planned."""
        if plan is not None:
            self.plan_with(plan)
        self._resume_with = list(workers)
        self._resume.set()
