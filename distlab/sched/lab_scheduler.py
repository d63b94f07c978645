"""A shared Lab's scheduler: every ``interval`` seconds a policy re-allocates the runs' workers.

A round (``LabScheduler.step``) turns the Lab's live runs into ``JobSpec`` s (each run's speedup
from the Lab's cost model and its own measured segments, and its restart's measured cost:
sched/lab_pricing.py), asks the policy (``distlab.sched``) for an allocation and checks it
(``check_allocation``). A refused allocation (over capacity, an unknown run or worker, a run that
cannot be resized moved, the policy raising) is logged in ``notes`` and the previous one kept. An
accepted one is applied through the runs' pause-checkpoint-resize-resume path: every run that loses
or changes workers pauses at a step with a checkpoint first, then queued runs start and paused runs
resume on their new workers (re-planned for them; a run launched with ``strategy="auto"`` under the
strategy the policy chose for its new allocation, when that beats its own by ``SWITCH_MARGIN``). A
round also runs as soon as a run is submitted or ends, and with ``lab.adapt`` it ends by resizing
the cluster to the runs' target (sched/lab_adapt.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from distlab.errors import LaunchError, SchedulerError
from distlab.sched import get_policy
from distlab.sched.goodput import GoodputPolicy
from distlab.sched.lab_cluster import ClusterView
from distlab.sched.lab_pricing import RestartPricer, plan_as, run_speedup, switch_to
from distlab.sched.policy import Allocated, Allocation, JobSpec, Policy, check_allocation
from distlab.sched.restart import RELAUNCH_GUESS

log = logging.getLogger("distlab.sched")

DEFAULT_INTERVAL = 30.0  # seconds between rounds (AdaptDL's scheduler re-optimises every 30-60 s)
# the goodput policy's restart penalty for a job without a restart cost of its own; a Lab's
# scheduler gives every run its measured one (sched/lab_pricing.py), so this prices none of them
LAB_RESTART_DELAY = RELAUNCH_GUESS


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
    profile: Any = None  # its model's profile at its per-replica batch (None: priced by measurements)
    optimizer: str | None = None  # what its optimizer's state costs like: "sgd", "momentum", "adam"
    chooses: bool = False  # launched with strategy="auto": the scheduler picks its strategy
    plans: list[tuple[float, str, int]] = field(default_factory=list)  # (wall time, strategy, hosts)
    priced: Any = None  # (key, speedup, basis): this round's speedup, kept while nothing changed
    speedup_basis: str = "linear"  # where its speedup came from: linear, measured, cost model (+ measured)
    pending: tuple[float, int, bool] | None = None  # a (re)launch under way: (since, restart before, resumed)
    start_s: float | None = None  # seconds from its start to its first step
    relaunches: list[float] = field(default_factory=list)  # measured relaunches, checkpoint I/O excluded
    restart_cost: float = float("nan")  # seconds a restart costs it, as the policy last priced it

    @property
    def state(self) -> str:
        """queued, running, paused (held no workers: waits to resume) or how it ended."""
        status = self.run.status
        if status == "paused" and not self.workers:
            return "waiting (paused)"
        return status


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
    cost_model: Callable[[], Any] | None = None  # the Lab's cost model now (None: priced by measurements)
    checkpoint_dir: Any = None  # where the storage rate a restart is priced at is measured

    def __post_init__(self) -> None:
        self.policy = get_policy(self.policy)
        self.pricer = RestartPricer(self.checkpoint_dir)
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
        self,
        run: Any,
        view: ClusterView,
        min_workers: int,
        max_workers: int,
        resizable: bool,
        *,
        chooses: bool = False,
        profiles: dict[int, Any] | None = None,
        optimizer: str | None = None,
    ) -> LabJob:
        """Queue ``run`` (not started) for ``min_workers..max_workers`` workers; a round runs now.
        ``chooses``: the scheduler picks its strategy per allocation; ``profiles``: its model's
        profiles by per-replica batch (the launch's), which the cost model prices it with."""
        job = LabJob(run, view, min_workers, max_workers, resizable, time.monotonic())
        job.chooses, job.optimizer = chooses, optimizer or getattr(run.forecast, "optimizer", None)
        job.profile = (profiles or {}).get(int(run.batch_size)) or getattr(run.forecast, "profile", None)
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
            for j in live:
                self.pricer.settle(j)
            specs = [self._spec(j, now, len(hosts), res) for j in live]
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
            self._apply(alloc, live, now, hosts)
            self._adapt([self._spec(j, now, len(hosts), res) for j in live], now)
            return {j.run.id: j.workers for j in live if j.workers}

    def _spec(self, job: LabJob, now: float, capacity: int, res: Any) -> JobSpec:
        fixed = job.started is not None and not job.resizable
        low = len(job.workers) if fixed else min(job.min_workers, capacity)
        high = len(job.workers) if fixed else min(job.max_workers, capacity)
        cm = self.cost_model() if self.cost_model is not None else None
        speedup, job.speedup_basis = run_speedup(job, cm, res)
        others = [t for j in self.jobs for t in j.relaunches]
        job.restart_cost = self.pricer.cost(job, others)
        return JobSpec(
            name=job.run.id,
            speedup=speedup,
            restart_cost=job.restart_cost,
            strategy=job.run.strategy.name,
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

    def _apply(self, alloc: Allocation, live: list[LabJob], now: float, hosts: dict[str, str]) -> None:
        changed = [
            (j, tuple(alloc.get(j.run.id, ())))
            for j in live
            if set(alloc.get(j.run.id, ())) != set(j.workers)
        ]
        named = alloc.strategies if isinstance(alloc, Allocated) else {}
        moving: list[tuple[LabJob, tuple[str, ...]]] = []
        for job, new in changed:  # first every run that changes stops at a step with a checkpoint
            if job.started is None:
                moving.append((job, new))
                continue
            if not job.workers:  # paused with none: it resumes below
                moving.append((job, new))
                continue
            self.pricer.mark(job, resumed=True)  # its relaunch runs from this pause to its next step
            try:
                paused = job.run.pause(self.pause_within)
            except LaunchError as exc:
                job.pending = None
                self._note(f"round {self.rounds}: run {job.run.id} was not resized: {exc}")
                continue
            if paused:
                moving.append((job, new))
            else:  # it ended first: its workers are free anyway
                job.ended, job.workers, job.pending = now, (), None
                self._event(now, job)
        for job, new in moving:  # then the queued start and the paused resume on their workers
            spread = len({hosts.get(w, w) for w in new})
            chosen = switch_to(job, named.get(job.run.id), new, spread) if new else None
            plan = plan_as(chosen, job.profile, self.cluster, job.run.strategy.batch) if chosen else None
            if not new:
                job.workers, job.pending = (), None  # waits: its relaunch is timed from its resume
            elif job.started is None:
                job.view.move_to(new)
                self.pricer.mark(job, resumed=False)
                try:
                    if not job.run.start_on(list(new), plan):
                        continue
                except Exception as exc:  # noqa: BLE001 - e.g. its strategy does not fit this world
                    why = f"{type(exc).__name__}: {exc}"
                    what = f"run {job.run.id} could not start on {len(new)} worker(s): {why}"
                    job.run.refuse(LaunchError(what))
                    self._note(f"round {self.rounds}: {what}")
                    continue
                job.started, job.workers = time.monotonic(), new
                self._planned(job, spread)
            else:
                if job.pending is None:
                    self.pricer.mark(job, resumed=True)
                job.view.move_to(new)
                job.run.resume_on(list(new), plan)
                job.workers = new
                job.restarts += 1
                self.reallocations += 1
                self._planned(job, spread, chosen.name if chosen is not None else None)
            self._event(now, job)

    def _planned(self, job: LabJob, hosts: int, name: str | None = None) -> None:
        """What the run trains under from now (its segments' strategy when its steps are priced)."""
        if name is not None and name != job.run.strategy.name:
            self._note(
                f"round {self.rounds}: run {job.run.id} resumes as {name} (was {job.run.strategy.name})"
            )
        job.plans.append((time.time(), name or job.run.strategy.name, hosts))

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
    time), ``"fifo"``, ``"goodput"`` (each run's restart priced as measured: sched/lab_pricing.py) or a
    Policy."""
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
