"""Pollux's goodput policy: share workers so the power mean (p = -1) of every job's speedup is highest.

The objective is the OSDI'21 artifact's (``simulator/pollux.py``, ``Problem._evaluate``): each job's
speedup is taken relative to its speedup at a fair share (``ceil(workers / jobs)`` replicas on one
host) and scaled by ``hosts / workers``; a job whose allocation changes has it multiplied by the
restart factor ``max(age - restarts * delay, 0) / (age + delay)``; the power mean with p = -1
(``(sum((s + 1e-3) ** -1) / J) ** -1``) of these is maximised, so leaving a job with nothing costs
far more than slowing a job down (fairness). Constraints: each job 0 or within
[min_replicas, max_replicas], host capacity, at most one multi-host job per host.

Pollux searches with a genetic algorithm (NSGA-II, 100 x 100 evaluations per round). Here the
objective is separable over jobs, so a greedy on marginal gain finds it directly: every job starts
at 0 replicas, and the step that lowers ``sum 1 / (s + 1e-3)`` most per worker added is taken
until workers run out; a step may add several replicas at once (so a restart penalty or a
speedup that only pays off at a larger size is crossed), and "keep the previous placement" is a
step of its own with no penalty. The replica counts are then placed on hosts: kept jobs where they
were, multi-host jobs on the emptiest hosts, single-host jobs best-fit. It is deterministic and
takes milliseconds for a hundred jobs, where the genetic search takes seconds.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from distlab.sched.policy import Allocation, JobSpec, Layout, fair_replicas, fewest_hosts, place

EPS = 1e-3  # Pollux's floor inside the power mean: a job with no workers counts as speedup 1e-3


@dataclass(frozen=True)
class GoodputPolicy:
    """Pollux's allocation policy (``"goodput"``); ``restart_delay`` is the seconds a restart costs."""

    restart_delay: float = 30.0
    power: float = -1.0

    def allocate(
        self,
        jobs: Sequence[JobSpec],
        workers: Mapping[str, str] | Sequence[str],
        previous: Mapping[str, Sequence[str]],
    ) -> Allocation:
        layout = Layout.of(workers)
        if not jobs or not layout.hosts:
            return {}
        # Pollux's order: less attained service first, then arrival; it breaks ties in the greedy
        jobs = sorted(jobs, key=lambda j: (j.attained, j.submitted, j.name))
        names = [j.name for j in jobs]
        capacity = layout.capacity
        base = layout.counts(previous, names)
        tables = [self._table(j, base[i], capacity, len(jobs)) for i, j in enumerate(jobs)]
        target, keep = _greedy(tables, int(capacity.sum()))
        counts = _pack(target, keep, base, capacity, layout.hosts_known, jobs)
        return layout.to_workers(counts, names, previous)

    def value(
        self, jobs: Sequence[JobSpec], workers: Mapping[str, str], allocation: Mapping, previous: Mapping
    ) -> float:
        """The objective (the power mean of scaled speedups) of an allocation: higher is better."""
        layout = Layout.of(workers)
        names = [j.name for j in jobs]
        new, old = layout.counts(allocation, names), layout.counts(previous, names)
        scale = self._scale(layout.capacity)
        values = []
        for i, j in enumerate(jobs):
            n, r = np.count_nonzero(new[i]), int(new[i].sum())
            s = j.speedups(np.array([n]), np.array([r]))[0] / self._base(j, len(jobs), layout.capacity)
            factor = 1.0 if (new[i] == old[i]).all() else self._factor(j)
            values.append(s * scale * factor)
        return _power_mean(np.array(values), self.power)

    def _factor(self, job: JobSpec) -> float:
        d = self.restart_delay
        return max(job.age - job.restarts * d, 0.0) / (job.age + d)

    @staticmethod
    def _scale(capacity: np.ndarray) -> float:
        # a dominant share of one host's worth of workers counts as speedup 1 (Pollux's scaling)
        return len(capacity) / float(capacity.sum())

    @staticmethod
    def _base(job: JobSpec, n_jobs: int, capacity: np.ndarray) -> float:
        fair = fair_replicas(int(capacity.sum()), n_jobs)
        base = float(job.speedups(np.array([1]), np.array([fair]))[0])
        return base if base > 0 else 1.0

    def _table(self, job: JobSpec, prev: np.ndarray, capacity: np.ndarray, n_jobs: int) -> _Table:
        """The job's cost ``1 / (s + eps)`` at each replica count, penalised, and its keep option."""
        top = int(min(job.max_replicas, capacity.sum()))
        r = np.arange(top + 1)
        n = fewest_hosts(r, capacity)
        scale = self._scale(capacity) / self._base(job, n_jobs, capacity)
        s = job.speedups(n, r) * scale
        r_prev = int(prev.sum())
        # every change restarts the job, its first start included (Pollux prices a start like a
        # restart: a job that arrived this instant waits a round); 0 replicas is speedup 0 anyway
        cost = _cost(s * self._factor(job), self.power)
        if 0 < job.min_replicas:
            cost[1 : job.min_replicas] = np.inf
        keep = None
        if 0 < r_prev <= top and (r_prev >= job.min_replicas):
            n_prev = np.count_nonzero(prev)
            s_prev = job.speedups(np.array([n_prev]), np.array([r_prev]))[0] * scale
            keep = (r_prev, float(_cost(np.array([s_prev]), self.power)[0]))
        return _Table(cost, keep)


@dataclass(frozen=True)
class _Table:
    cost: np.ndarray  # cost of each replica count under a new placement
    keep: tuple[int, float] | None  # (replicas, cost) of the previous placement, unchanged


def _cost(s: np.ndarray, p: float) -> np.ndarray:
    # the power mean rises as sum((s + eps) ** p) falls (p < 0), as sum(log(s + eps)) rises (p = 0)
    # or as sum((s + eps) ** p) rises (p > 0): the cost is the sum to lower
    if p < 0:
        return (s + EPS) ** p
    return -np.log(s + EPS) if p == 0 else -((s + EPS) ** p)


def _power_mean(values: np.ndarray, p: float) -> float:
    if p == 0:
        return float(np.exp(np.mean(np.log(values + EPS))))
    return float((np.mean((values + EPS) ** p)) ** (1.0 / p))


def _greedy(tables: list[_Table], workers: int) -> tuple[list[int], list[bool]]:
    """Replica counts by marginal gain per worker; ``keep[j]``: job j stays where it was."""
    count = [0] * len(tables)
    keep = [False] * len(tables)
    free = workers

    def best_step(j: int) -> tuple[float, int, bool] | None:
        t, r0 = tables[j], count[j]
        here = t.keep[1] if keep[j] and t.keep else t.cost[r0]
        top = min(len(t.cost) - 1, r0 + free)
        best: tuple[float, int, bool] | None = None
        if top > r0:
            r = np.arange(r0 + 1, top + 1)
            gain = (here - t.cost[r0 + 1 : top + 1]) / (r - r0)
            i = int(np.argmax(gain))
            if gain[i] > 0:
                best = (float(gain[i]), int(r[i]), False)
        if t.keep and not keep[j] and r0 < t.keep[0] <= r0 + free:
            g = (here - t.keep[1]) / (t.keep[0] - r0)
            if g > 0 and (best is None or g >= best[0]):
                best = (g, t.keep[0], True)
        return best

    heap: list[tuple[float, int, int, bool]] = []
    for j in range(len(tables)):
        step = best_step(j)
        if step:
            heapq.heappush(heap, (-step[0], j, step[1], step[2]))
    while heap and free > 0:
        gain, j, r, is_keep = heapq.heappop(heap)
        step = best_step(j)  # free workers may have shrunk since this entry was pushed
        if step is None:
            continue
        if (step[1], step[2]) != (r, is_keep):
            heapq.heappush(heap, (-step[0], j, step[1], step[2]))
            continue
        free -= r - count[j]
        count[j], keep[j] = r, is_keep
        step = best_step(j)
        if step:
            heapq.heappush(heap, (-step[0], j, step[1], step[2]))
    return count, keep


def _pack(
    target: list[int],
    keep: list[bool],
    base: np.ndarray,
    capacity: np.ndarray,
    hosts_known: bool,
    jobs: Sequence[JobSpec],
) -> np.ndarray:
    """Place the chosen counts on hosts: kept jobs first, then multi-host jobs, then the rest best-fit.

    A job that no longer fits (holes left by kept jobs) gets the most it can still have on free
    hosts, or nothing below its minimum.
    """
    counts = np.zeros_like(base)
    free = capacity.copy()
    shared = np.zeros(len(capacity), dtype=bool)
    for j in (j for j in range(len(target)) if keep[j]):
        counts[j] = base[j]
        free -= base[j]
        if np.count_nonzero(base[j]) > 1:
            shared |= base[j] > 0
    rest = [j for j in range(len(target)) if not keep[j] and target[j] > 0]
    rest.sort(key=lambda j: -target[j])  # large jobs first, while whole hosts are free
    for j in rest:
        r = target[j]
        while r >= max(jobs[j].min_replicas, 1):
            spot = place(r, free, shared, hosts_known)
            if spot is not None:
                counts[j] = spot
                free -= spot
                if np.count_nonzero(spot) > 1:
                    shared |= spot > 0
                break
            r -= 1
    return counts
