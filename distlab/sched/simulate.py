"""Replay job arrivals on a simulated cluster under a policy and report completion times (Pollux's loop).

Every ``interval`` seconds (Pollux: 60) each job advances by its own model, then the policy is
asked for a new allocation for the jobs that have arrived and not finished; a refused allocation
(distlab.sched.check_allocation) keeps the previous one; every job whose workers change restarts,
which costs it ``restart`` seconds of no progress (Pollux: 30).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from distlab.errors import SchedulerError
from distlab.sched.policy import Allocation, JobSpec, Layout, Policy, check_allocation


@dataclass(frozen=True)
class SimCluster:
    """``hosts`` hosts of ``slots`` workers each (Pollux's artifact: 16 hosts of 4 GPUs)."""

    hosts: int
    slots: int = 1

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.slots < 1:
            raise SchedulerError(f"SimCluster(hosts={self.hosts}, slots={self.slots}): both must be >= 1")

    @property
    def workers(self) -> dict[str, str]:
        """``{worker: host}``, workers named ``h<i>/w<k>``."""
        return {f"h{h:02d}/w{k}": f"h{h:02d}" for h in range(self.hosts) for k in range(self.slots)}


class SimJob(Protocol):
    """A job the simulator can replay: what the policy sees of it, and how it progresses."""

    name: str
    arrival: float
    completion: float | None

    def spec(self, now: float) -> JobSpec:
        """The job as the policy sees it at time ``now``."""
        ...

    def reallocate(self, placement: tuple[int, ...]) -> None:
        """New replicas per host (empty: none); a change restarts the job."""
        ...

    def step(self, now: float, seconds: float) -> None:
        """Advance from ``now`` by ``seconds``; set ``completion`` when the job finishes."""
        ...


@dataclass
class WorkJob:
    """A synthetic job: ``work`` seconds on one replica, run ``speedup(nodes, replicas)`` times faster."""

    name: str
    arrival: float
    work: float
    speedup: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    max_replicas: int = 1
    min_replicas: int = 0
    restart: float = 30.0
    completion: float | None = None
    done: float = 0.0
    restarts: int = -1
    attained: float = 0.0
    _placement: tuple[int, ...] = ()
    _pause: float = 0.0

    def spec(self, now: float) -> JobSpec:
        return JobSpec(
            self.name,
            self.speedup,
            self.min_replicas,
            self.max_replicas,
            self.arrival,
            now - self.arrival,
            max(self.restarts, 0),
            self.attained,
        )

    def reallocate(self, placement: tuple[int, ...]) -> None:
        self._placement = tuple(p for p in placement if p)
        if self._placement:
            self._pause = self.restart
            self.restarts += 1

    def step(self, now: float, seconds: float) -> None:
        if not self._placement or self.completion is not None:
            return
        replicas = sum(self._placement)
        self.attained += seconds * replicas
        pause = min(self._pause, seconds)
        self._pause -= pause
        n, r = np.array([len(self._placement)]), np.array([replicas])
        rate = float(r[0] if self.speedup is None else np.asarray(self.speedup(n, r)).ravel()[0])
        run = seconds - pause
        if rate > 0 and self.done + rate * run >= self.work:
            self.completion = now + pause + (self.work - self.done) / rate
            self.done = self.work
        else:
            self.done += rate * run


@dataclass
class SimResult:
    """What a replay measured: per job arrival, completion and restarts, and the cluster's use."""

    jobs: Any
    """pandas DataFrame, one row per job: arrival, completion, jct, restarts."""
    allocations: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    """(time, {job: workers}) after each scheduling round."""
    utilisation: float = 0.0
    """Worker-seconds allocated / (workers x the time until the last job finished)."""
    refused: int = 0
    """Rounds whose allocation the check refused (the previous one was kept)."""

    @property
    def avg_jct(self) -> float:
        return float(self.jobs.jct.mean())

    @property
    def p99_jct(self) -> float:
        return float(np.percentile(self.jobs.jct.dropna(), 99))

    @property
    def makespan(self) -> float:
        """From the first arrival to the last completion, in seconds."""
        return float(self.jobs.completion.max() - self.jobs.arrival.min())

    def summary(self) -> dict[str, float]:
        return {
            "avg_jct": self.avg_jct,
            "p99_jct": self.p99_jct,
            "makespan": self.makespan,
            "utilisation": self.utilisation,
            "unfinished": int(self.jobs.completion.isna().sum()),
        }


def simulate(
    workload: Sequence[SimJob],
    policy: Policy | str,
    cluster: SimCluster | Mapping[str, str],
    *,
    interval: float = 60.0,
    limit: float = 30 * 24 * 3600.0,
) -> SimResult:
    """Replay ``workload`` under ``policy`` (a Policy or ``"goodput"``/``"fifo"``) on ``cluster``.

    Stops when every job finished, or at ``limit`` simulated seconds (unfinished jobs then have no
    completion time).
    """
    import pandas as pd

    from distlab.sched import get_policy

    chosen = get_policy(policy)
    workers = cluster.workers if isinstance(cluster, SimCluster) else dict(cluster)
    if interval <= 0:
        raise SchedulerError(f"interval={interval}: give a positive number of seconds")
    layout = Layout.of(workers)
    host_index = layout.host_of()
    now, held = 0.0, 0.0
    current: Allocation = {}
    result = SimResult(jobs=None)
    while now < limit and any(j.completion is None for j in workload):
        for job in workload:
            if job.arrival <= now:
                job.step(now, interval)
        held += interval * sum(len(ws) for ws in current.values())
        now += interval
        active = [j for j in workload if j.arrival <= now and j.completion is None]
        current = {k: v for k, v in current.items() if any(j.name == k for j in active)}
        if not active:
            continue
        specs = [j.spec(now) for j in active]
        try:
            proposed = check_allocation(chosen.allocate(specs, workers, current), specs, workers)
        except SchedulerError:
            result.refused += 1
            proposed = current
        for job in active:
            if proposed.get(job.name) != current.get(job.name):
                job.reallocate(_placement(proposed.get(job.name, ()), host_index, len(layout.hosts)))
        current = proposed
        result.allocations.append((now, {k: len(v) for k, v in current.items()}))
    end = max((j.completion for j in workload if j.completion is not None), default=now)
    result.utilisation = held / (len(workers) * end) if end > 0 else 0.0
    rows = [
        {
            "name": j.name,
            "arrival": j.arrival,
            "completion": j.completion,
            "jct": None if j.completion is None else j.completion - j.arrival,
            "restarts": max(int(getattr(j, "restarts", 0) or 0), 0),
        }
        for j in workload
    ]
    result.jobs = pd.DataFrame(rows).astype({"completion": float, "jct": float})
    return result


def _placement(chosen: Sequence[str], host_index: dict[str, int], hosts: int) -> tuple[int, ...]:
    """Replicas per host, in host order, for a job's workers (Pollux's ``placement``)."""
    per = np.bincount([host_index[w] for w in chosen], minlength=hosts) if chosen else np.zeros(0, int)
    return tuple(int(c) for c in per if c)
