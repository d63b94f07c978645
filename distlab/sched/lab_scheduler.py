"""A shared Lab's scheduler: every ``interval`` seconds a policy re-allocates the runs' workers.

A round (``LabScheduler.step``) turns the Lab's live runs into ``JobSpec`` s (each run's speedup from
its own measured throughput at each world it has run at; linear, as Pollux starts, where it has
not), asks the policy (``distlab.sched``) for an allocation and checks it (``check_allocation``).
A refused allocation (over capacity, an unknown run or worker, a run that cannot be resized moved,
the policy raising) is logged in ``notes`` and the previous one kept. An accepted one is applied
through the runs' pause-checkpoint-resize-resume path: every run that loses or changes workers
pauses at a step with a checkpoint first, then queued runs start and paused runs resume on their
new workers (re-planned for them). A round also runs as soon as a run is submitted or ends, and
with ``lab.adapt`` it ends by resizing the cluster to the runs' target (sched/lab_adapt.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab.errors import LaunchError, SchedulerError
from distlab.sched import get_policy
from distlab.sched.goodput import GoodputPolicy
from distlab.sched.lab_cluster import ClusterView
from distlab.sched.policy import Allocation, JobSpec, Policy, SpeedupFn, check_allocation

log = logging.getLogger("distlab.sched")

DEFAULT_INTERVAL = 30.0  # seconds between rounds (AdaptDL's scheduler re-optimises every 30-60 s)
# seconds a resize costs a run on warm workers (pause at a step with a checkpoint, new ranks, first
# steps): Pollux's restart penalty prices it (its simulator assumes 30 s for a cluster's jobs)
LAB_RESTART_DELAY = 5.0
WARMUP_STEPS = 3  # a segment's first steps after a (re)start are warm-up, not its throughput


@dataclass
class LabJob:
    """One run on a shared Lab, as its scheduler tracks it."""

    run: Any
    view: ClusterView
    min_workers: int
    max_workers: int
    resizable: bool
    submitted: float
    workers: tuple[str, ...] = ()
    started: float | None = None
    ended: float | None = None
    restarts: int = 0
    attained: float = 0.0  # worker-seconds held so far
    counted: float = 0.0  # when ``attained`` was last brought up to date

    @property
    def state(self) -> str:
        """queued, running, paused (held no workers: waits to resume) or how it ended."""
        status = self.run.status
        if status == "paused" and not self.workers:
            return "waiting (paused)"
        return status


def segment_throughputs(metrics: Any) -> dict[int, float]:
    """Samples per second at each world size a run has trained at (its latest segment at each),
    from rank 0's records after each (re)start's warm-up: the data position over the wall clock."""
    if metrics is None or len(metrics) == 0 or "world" not in metrics:
        return {}
    r0 = metrics[metrics["rank"] == 0]
    out: dict[int, float] = {}
    for (_, world), seg in r0.groupby(["restart", "world"], sort=True):
        seg = seg.sort_values("step").iloc[WARMUP_STEPS:]
        if len(seg) < 3:
            continue
        dt = float(seg["wall_time"].iloc[-1] - seg["wall_time"].iloc[0])
        if dt > 0:
            out[int(world)] = float(seg["samples"].iloc[-1] - seg["samples"].iloc[0]) / dt
    return out


def measured_speedup(throughputs: dict[int, float]) -> SpeedupFn | None:
    """A run's speedup at r replicas from its measured throughputs: exact where measured, linear
    beyond the nearest measured world below r (Pollux's start, speedup = replicas, where nothing is
    measured: None)."""
    if not throughputs:
        return None
    worlds = sorted(throughputs)
    one = throughputs[1] if 1 in throughputs else throughputs[worlds[0]] / worlds[0]

    def speedup(nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        out = []
        for r in np.asarray(replicas, dtype=int).ravel():
            below = [w for w in worlds if w <= r]
            w = below[-1] if below else worlds[0]
            out.append(throughputs[w] / one * r / w)
        return np.asarray(out, dtype=float).reshape(np.shape(replicas))

    return speedup


@dataclass
class LabScheduler:
    """Allocates a shared Lab's workers among its runs with ``policy`` (module docstring)."""

    cluster: Any
    policy: Policy
    interval: float = DEFAULT_INTERVAL
    pause_within: float = 30.0
    jobs: list[LabJob] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # (time, run, workers): the plot's lanes
    rounds: int = 0
    reallocations: int = 0  # running runs moved to a new worker set (each a pause and a resume)
    adapt_range: tuple[int, int] | None = None  # lab.adapt(minimum, maximum): the cluster follows the runs
    idle_rounds: int = 0  # rounds in a row with a worker no run held
    sizes: list[dict[str, Any]] = field(default_factory=list)  # lab.adapt's resizes of the cluster

    def __post_init__(self) -> None:
        self.policy = get_policy(self.policy)
        if not (isinstance(self.interval, (int, float)) and self.interval > 0):
            raise SchedulerError(f"interval={self.interval!r}: give the seconds between rounds, above 0")
        self.t0 = time.monotonic()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="distlab-scheduler", daemon=True)
        self._thread.start()

    # -- submissions ----------------------------------------------------------------------------
    def submit(
        self, run: Any, view: ClusterView, min_workers: int, max_workers: int, resizable: bool
    ) -> LabJob:
        """Queue ``run`` (not started) for ``min_workers..max_workers`` workers; a round runs now."""
        job = LabJob(run, view, min_workers, max_workers, resizable, time.monotonic())
        self.jobs.append(job)  # not under the round's lock: a launch never waits for a resize
        run.mark_queued()
        run.on_done.append(lambda _run: self.wake())
        self.wake()
        return job

    def wake(self) -> None:
        """Run a round now instead of at the next interval."""
        self._wake.set()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(self.pause_within + 5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - the loop outlives one bad round; the note says why
                self._note(f"round {self.rounds} failed: {type(exc).__name__}: {exc}")

    # -- one round --------------------------------------------------------------------------------
    def step(self) -> Allocation:
        """One round: the policy's allocation applied, or the previous kept (a note says why)."""
        with self._lock:
            now = time.monotonic()
            self.rounds += 1
            self._settle_ended(now)
            live = [j for j in self.jobs if j.ended is None]
            previous = {j.run.id: j.workers for j in live if j.workers}
            if not live:
                self._adapt([], now)
                return {}
            res = self.cluster.resources
            hosts = {a: r.host for a, r in zip(res.addresses, res.ranks)}
            specs = [self._spec(j, now, len(hosts)) for j in live]
            try:
                alloc = check_allocation(self.policy.allocate(specs, hosts, previous), specs, hosts)
                self._check_fixed(alloc, live)
            except SchedulerError as exc:
                self._note(f"round {self.rounds}: allocation refused, previous kept: {exc}")
                return previous
            except Exception as exc:  # noqa: BLE001 - a user's policy that raises is one refused round
                what = f"{type(exc).__name__}: {exc}"
                self._note(f"round {self.rounds}: the policy raised {what}; previous allocation kept")
                return previous
            self._apply(alloc, live, now)
            self._adapt([self._spec(j, now, len(hosts)) for j in live], now)
            return {j.run.id: j.workers for j in live if j.workers}

    def _spec(self, job: LabJob, now: float, capacity: int) -> JobSpec:
        fixed = job.started is not None and not job.resizable
        low = len(job.workers) if fixed else min(job.min_workers, capacity)
        high = len(job.workers) if fixed else min(job.max_workers, capacity)
        return JobSpec(
            name=job.run.id,
            speedup=measured_speedup(segment_throughputs(job.run.metrics)),
            min_replicas=low,
            max_replicas=max(high, 1),
            submitted=job.submitted - self.t0,
            age=now - job.submitted,
            restarts=job.restarts,
            attained=job.attained,
        )

    def _check_fixed(self, alloc: Allocation, live: list[LabJob]) -> None:
        for job in live:
            if (
                job.started is not None
                and not job.resizable
                and set(alloc.get(job.run.id, ())) != set(job.workers)
            ):
                raise SchedulerError(
                    f"the policy moved run {job.run.id}, which cannot be resized (launched with "
                    "elastic=False); keep its workers"
                )

    def _settle_ended(self, now: float) -> None:
        for job in self.jobs:
            if job.workers:
                job.attained += len(job.workers) * (now - job.counted)
            job.counted = now
            if job.workers and job.run.status == "running" and set(job.run.workers) != set(job.workers):
                job.workers = tuple(job.run.workers)  # it resumed on the survivors of a lost worker
                self._event(now, job)
            if job.ended is None and job.run.done:
                job.ended = now
                if job.workers:
                    job.workers = ()
                    self._event(now, job)

    def _apply(self, alloc: Allocation, live: list[LabJob], now: float) -> None:
        changed = [
            (j, tuple(alloc.get(j.run.id, ())))
            for j in live
            if set(alloc.get(j.run.id, ())) != set(j.workers)
        ]
        moving: list[tuple[LabJob, tuple[str, ...]]] = []
        for job, new in changed:  # first every run that changes stops at a step with a checkpoint
            if job.started is None:
                moving.append((job, new))
                continue
            if not job.workers:  # paused with none: it resumes below
                moving.append((job, new))
                continue
            try:
                paused = job.run.pause(self.pause_within)
            except LaunchError as exc:
                self._note(f"round {self.rounds}: run {job.run.id} was not resized: {exc}")
                continue
            if paused:
                moving.append((job, new))
            else:  # it ended first: its workers are free anyway
                job.ended, job.workers = now, ()
                self._event(now, job)
        for job, new in moving:  # then the queued start and the paused resume on their workers
            if not new:
                job.workers = ()
            elif job.started is None:
                job.view.move_to(new)
                try:
                    if not job.run.start_on(list(new)):
                        continue
                except Exception as exc:  # noqa: BLE001 - e.g. its strategy does not fit this world
                    why = f"{type(exc).__name__}: {exc}"
                    what = f"run {job.run.id} could not start on {len(new)} worker(s): {why}"
                    job.run.refuse(LaunchError(what))
                    self._note(f"round {self.rounds}: {what}")
                    continue
                job.started, job.workers = time.monotonic(), new
            else:
                job.view.move_to(new)
                job.run.resume_on(list(new))
                job.workers = new
                job.restarts += 1
                self.reallocations += 1
            self._event(now, job)

    def rescale(self, resize: Callable[[], int], within: float) -> int:
        """(lab.scale) Pause every run holding workers, ``resize()`` the cluster, then a round
        places them all again on the workers there are; returns ``resize()``'s worker count."""
        with self._lock:
            now = time.monotonic()
            self._settle_ended(now)
            for job in self.jobs:
                if job.ended is None and job.workers and job.started is not None and job.run.pause(within):
                    job.workers = ()
                    self._event(now, job)
            have = resize()
        self.wake()
        return have

    def _adapt(self, specs: list[JobSpec], now: float) -> None:
        """(lab.adapt) Resize the cluster to the jobs' target (sched/lab_adapt.py); a worker to retire
        that holds a rank has its run paused at a step with a checkpoint first."""
        if self.adapt_range is None:
            return
        from distlab.sched.lab_adapt import adapt_target

        live = [j for j in self.jobs if j.ended is None]
        held = {j.run.id: len(j.workers) for j in live}
        have = len(self.cluster.resources.addresses)
        self.idle_rounds = self.idle_rounds + 1 if sum(held.values()) < have else 0
        target = adapt_target(specs, held, have, self.idle_rounds, *self.adapt_range)
        if target == have:
            return
        if target < have:
            leaving = set(self.cluster.retiring(have - target))
            for job in live:
                if leaving & set(job.workers) and job.run.pause(self.pause_within):
                    job.workers = ()
                    self._event(now, job)
        got = self.cluster.scale(target, self.pause_within)
        self.idle_rounds = 0
        self.sizes.append({"time": now - self.t0, "from": have, "to": got, "target": target})
        log.info("adapt: the cluster went from %d to %d workers (target %d)", have, got, target)
        self.wake()  # the next round places the runs on the workers there are now

    def _event(self, now: float, job: LabJob) -> None:
        self.events.append({"time": now - self.t0, "run": job.run.id, "workers": tuple(job.workers)})

    def _note(self, text: str) -> None:
        self.notes.append(text)
        log.warning(text)

    def job_of(self, run: Any) -> LabJob | None:
        return next((j for j in self.jobs if j.run is run), None)


def lab_policy(scheduler: Any, interval: float | None) -> Policy | None:
    """``Lab(scheduler=...)``'s policy, checked before the Lab starts its cluster: None (one run at a
    time), ``"fifo"``, ``"goodput"`` (priced with a Lab's restart, ``LAB_RESTART_DELAY``) or a Policy."""
    if scheduler is None:
        if interval is not None:
            raise SchedulerError("interval= needs a scheduler: Lab(scheduler='goodput', interval=...)")
        return None
    if interval is not None and not (isinstance(interval, (int, float)) and interval > 0):
        raise SchedulerError(f"interval={interval!r}: give the seconds between rounds, above 0")
    if scheduler == "goodput":
        return GoodputPolicy(restart_delay=LAB_RESTART_DELAY)
    return get_policy(scheduler)


def asked_workers(
    shared: bool,
    strategy: Any,
    workers: int | None,
    min_workers: int | None,
    max_workers: int | None,
    *,
    have: int,
    grows: bool,
) -> tuple[int, int] | None:
    """The (fewest, most) workers a launch asks for on a Lab of ``have`` workers (``shared``: it has
    a scheduler; ``grows``: ``lab.scale`` can add workers); None: every worker, one run at a time."""
    from distlab.runs.validate import check_positive

    for name, value in (("workers", workers), ("min_workers", min_workers), ("max_workers", max_workers)):
        check_positive(name, value, optional=True)
    if workers is not None and (min_workers, max_workers) != (None, None):
        raise LaunchError("workers=: give either workers=N or min_workers=/max_workers=, not both")
    if not shared and (min_workers, max_workers) != (None, None):
        raise LaunchError(
            "min_workers=/max_workers=: a Lab without a scheduler cannot resize a run within a range; "
            "start it as dl.Lab(..., scheduler='goodput') (or 'fifo'), or pass workers=N"
        )
    if not shared and workers is None:
        return None
    world = getattr(strategy, "world", None)  # a Strategy object asks for its own world
    low = workers or min_workers or 1
    high = workers or max_workers or (world if isinstance(world, int) else have)
    if high > have:
        raise LaunchError(
            f"workers: {high} asked, but the Lab has {have}; ask for {have} or fewer"
            + (" (lab.scale(n) grows an embedded Lab)" if grows else "")
        )
    if low > high:
        raise LaunchError(f"min_workers={low} is above max_workers={high}; lower min_workers")
    return low, high
