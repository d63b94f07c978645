"""A Slurm Lab keeps its workers: a job that ends mid-run is replaced, and the run that lost it grows back.

Slurm ends a worker's job under a run (``scancel``, its walltime, a node failure); the run's
elastic path resumes on the survivors from its checkpoint (``runs/run.py``). dask-jobqueue submits
nothing by itself for it: SpecCluster drops the ended job after ``lost-worker-timeout`` but only
a later ``scale``/``_correct_state`` would submit one. A ``WorkerKeeper`` is the thread that
does: every second it asks ``SlurmJobs.heal`` for a job per ended one, and once the new worker
joined it pauses each run that shrank (its ranks stop at a step and write a checkpoint there) and
resumes it on as many workers as it was launched on, as ``lab.scale`` does: from that step, at
the same data position.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distlab.errors import DistlabError

if TYPE_CHECKING:
    from distlab.cluster.slurm import SlurmJobs

EVERY = 1.0  # seconds between looks at the jobs and the runs


def grow_run(run: Any, workers: list[str], world: int, within: float) -> bool:
    """Pause ``run`` at a step (checkpoint there) and resume it on the first ``world`` of ``workers``;
    True once resumed. Nothing (False) while its ranks are still starting after a restart, as a
    pause then would stop the old group, or when it ended or has too few workers to grow to."""
    if run.done or run.world >= world or len(workers) < world:
        return False
    m = run.metrics
    if not len(m):
        return False
    newest = m[m["restart"] == m["restart"].max()]
    if int(newest["world"].iloc[-1]) != run.world or run.status != "running":
        return False  # the driver is between segments: the survivors' ranks have not stepped yet
    if not run.pause(within):
        return False
    run.resume_on(workers[:world])
    return True


class WorkerKeeper:
    """The thread keeping ``jobs``' worker count for a Lab: ``runs()`` lists the Lab's runs,
    ``workers()`` its worker addresses in rank order; ``within`` seconds for a new job to join
    and for a run to pause. ``replaced`` counts the jobs it replaced, ``grown`` the runs it grew
    back; ``error`` is its last failure in one line (a refused or slow job), retried each second."""

    def __init__(
        self,
        jobs: SlurmJobs,
        runs: Callable[[], list[Any]],
        workers: Callable[[], list[str]],
        *,
        within: float,
        every: float = EVERY,
    ) -> None:
        self.jobs, self._runs, self._workers = jobs, runs, workers
        self.within, self.every = within, every
        self.replaced = 0
        self.grown = 0
        self.error: str | None = None
        self._launched_on: dict[str, int] = {}  # run id -> the world it had when first seen
        self._owed: dict[str, Any] = {}  # runs in flight when a job was replaced: grown back once shrunk
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="distlab-slurm-keeper", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - a thread's failure is kept, shown, and retried
                self.error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, DistlabError) else str(exc)

    def tick(self) -> None:
        """One look: replace ended jobs, then grow back each run that lost ranks."""
        runs = [r for r in self._runs() if not r.done]
        for run in runs:
            self._launched_on.setdefault(run.id, run.world)
        if self.jobs.lost and not self._stop.is_set():
            replaced = self.jobs.heal(within=self.within)
            self.replaced += replaced
            self.error = None
            if replaced:  # only the runs in flight when a job ended: a run a scheduler shrank stays so
                self._owed.update((r.id, r) for r in runs)
        for key, run in list(self._owed.items()):
            if run.done:
                del self._owed[key]
            elif run.world < self._launched_on[key] and not self._stop.is_set():
                if grow_run(run, self._workers(), self._launched_on[key], self.within):
                    self.grown += 1
                    del self._owed[key]

    def close(self, within: float = 30.0) -> None:
        """Stop the thread (waiting for a heal under way, at most ``within`` seconds)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(within)
