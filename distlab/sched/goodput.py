"""Pollux's goodput policy: share workers so the power mean (p = -1) of every job's speedup is highest.

The objective is the OSDI'21 artifact's (``simulator/pollux.py``, ``Problem._evaluate``): each job's
speedup is taken relative to its speedup at a fair share (``ceil(workers / jobs)`` replicas on one
host) and scaled by ``hosts / workers``; a job whose allocation changes has it multiplied by the
restart factor ``max(age - restarts * delay, 0) / (age + delay)``; the power mean with p = -1
(``(sum((s + 1e-3) ** -1) / J) ** -1``) of these is maximised, so leaving a job with nothing costs
far more than slowing a job down (fairness). Constraints: each job 0 or within
[min_replicas, max_replicas], host capacity, at most one multi-host job per host.

Pollux searches with a genetic algorithm (NSGA-II, 100 x 100 evaluations per round). The
objective is a sum over jobs of ``(s + 1e-3) ** -1``, so a greedy on marginal gain gets close
directly: every job starts at 0 replicas, and the step that lowers that sum most per worker
added is taken until none helps; a step may add several replicas at once (so a restart penalty,
or a speedup that only pays off at a larger size, is crossed), and "keep the previous placement"
is a step of its own, without the penalty. Two orders run, since which wins depends on how
replicas pack on hosts: (a) each step places the job at once on the fewest hosts the free
workers allow; (b) the counts are chosen first (each assumed on the fewest hosts), then placed:
kept jobs where they were, the largest next. The cheaper result is kept, then each job in turn
takes its cheapest option with the others fixed (best responses). How close this comes to an
exhaustive search, and how fast it is, is in datasets/measurements/README.md (sched-sim card).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from distlab.sched.policy import (
    Allocated,
    JobSpec,
    Layout,
    fair_replicas,
    fewest_hosts,
    job_names,
    name_strategies,
    place,
)

EPS = 1e-3  # Pollux's floor inside the power mean: a job with no workers counts as speedup 1e-3


@dataclass(frozen=True)
class GoodputPolicy:
    """Pollux's allocation policy (``"goodput"``); ``restart_delay`` is the seconds a restart costs a
    job that does not give its own (``JobSpec.restart_cost``). A job whose speedup names strategies
    (``StrategySpeedup``) is weighed at the best strategy for each allocation, and the allocation's
    ``strategies`` says which one it runs."""

    restart_delay: float = 30.0
    power: float = -1.0

    def allocate(
        self,
        jobs: Sequence[JobSpec],
        workers: Mapping[str, str] | Sequence[str],
        previous: Mapping[str, Sequence[str]],
    ) -> Allocated:
        layout = Layout.of(workers)
        if not jobs or not layout.hosts:
            return Allocated()
        # Pollux's order: less attained service first, then arrival; it breaks ties in the greedy
        jobs = sorted(jobs, key=lambda j: (j.attained, j.submitted, j.name))
        names = job_names(jobs)
        capacity = layout.capacity
        base = layout.counts(previous, names)
        choices = [self._choice(j, base[i], capacity, len(jobs)) for i, j in enumerate(jobs)]
        # two greedy orders, then best responses: which greedy wins depends on how the replicas
        # pack, so both run and the lower cost is kept (milliseconds each)
        search = _Search(choices, capacity, layout.hosts_known)
        candidates = [search.run(), _count_greedy(choices, capacity, layout.hosts_known)]
        counts = min(candidates, key=search.total)
        allocation = layout.to_workers(search.polish(counts), names, previous)
        return name_strategies(allocation, jobs, workers, previous)

    def value(
        self, jobs: Sequence[JobSpec], workers: Mapping[str, str], allocation: Mapping, previous: Mapping
    ) -> float:
        """The objective (the power mean of scaled speedups) of an allocation: higher is better."""
        layout = Layout.of(workers)
        names = job_names(jobs)
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
        d = self.restart_delay if job.restart_cost is None else job.restart_cost
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

    def _choice(self, job: JobSpec, prev: np.ndarray, capacity: np.ndarray, n_jobs: int) -> _Choice:
        top = int(min(job.max_replicas, capacity.sum()))
        scale = self._scale(capacity) / self._base(job, n_jobs, capacity)
        keep = None
        r_prev = int(prev.sum())
        if 0 < r_prev <= top and r_prev >= job.min_replicas:
            s_prev = job.speedups(np.array([np.count_nonzero(prev)]), np.array([r_prev]))[0] * scale
            keep = float(_cost(np.array([s_prev]), self.power)[0])
        # every change restarts the job, its first start included (Pollux prices a start like a
        # restart: a job that arrived this instant waits a round)
        return _Choice(job, prev.copy(), scale * self._factor(job), self.power, top, keep)


class _Choice:
    """One job's options in a round: its cost ``(s + eps) ** p`` at (hosts, replicas) after a
    restart, computed as the search asks, and the cost of keeping its previous placement."""

    def __init__(
        self, job: JobSpec, prev: np.ndarray, scale: float, power: float, top: int, keep: float | None
    ) -> None:
        self.job, self.prev, self.scale, self.power, self.top, self.keep = job, prev, scale, power, top, keep
        self.zero = float(_cost(np.zeros(1), power)[0])
        self.memo: dict[tuple[int, int], float] = {}

    def costs(self, n: np.ndarray, r: np.ndarray) -> np.ndarray:
        missing = sorted({(int(a), int(b)) for a, b in zip(n, r)} - self.memo.keys())
        if missing:
            mn, mr = (np.array(x) for x in zip(*missing))
            values = _cost(self.job.speedups(mn, mr) * self.scale, self.power)
            values[mr < max(self.job.min_replicas, 1)] = np.inf
            self.memo.update(zip(missing, values.tolist()))
        return np.array([self.memo[int(a), int(b)] for a, b in zip(n, r)])


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


class _Search:
    """The greedy over a jobs x hosts matrix: each step grows one job (re-placing it on the fewest
    hosts the free workers allow) or restores its previous placement, whichever lowers the cost
    most per worker added; free workers shrink as steps are taken, so a job's best step is
    recomputed when it comes off the heap (lazy greedy)."""

    def __init__(self, choices: list[_Choice], capacity: np.ndarray, hosts_known: bool) -> None:
        self.choices, self.capacity, self.hosts_known = choices, capacity, hosts_known
        self.x = np.zeros((len(choices), len(capacity)), dtype=int)
        self.kept = [False] * len(choices)

    def _here(self, j: int) -> float:
        c, row = self.choices[j], self.x[j]
        if self.kept[j]:
            return float(c.keep)  # type: ignore[arg-type]
        r = int(row.sum())
        return c.zero if r == 0 else float(c.costs(np.array([np.count_nonzero(row)]), np.array([r]))[0])

    def _room(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Workers free to job j (its own included), and the hosts another multi-host job holds."""
        own = self.x[j]
        free = self.capacity - self.x.sum(axis=0) + own
        multi = np.count_nonzero(self.x, axis=1) > 1
        multi[j] = False
        return free, np.asarray((self.x[multi] > 0).any(axis=0))

    def _hosts_needed(
        self, r: np.ndarray, free: np.ndarray, shared: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each replica count: the hosts ``place`` would use, and whether it fits at all."""
        eligible = np.sort(free * (~shared if self.hosts_known else 1))[::-1].cumsum()
        single = r <= free.max()
        return np.where(single, 1, np.searchsorted(eligible, r) + 1), single | (r <= eligible[-1])

    def _fits_prev(self, j: int, free: np.ndarray, shared: np.ndarray) -> bool:
        prev = self.choices[j].prev
        if not (prev <= free).all():
            return False
        return not (np.count_nonzero(prev) > 1 and self.hosts_known and (shared & (prev > 0)).any())

    def best_step(self, j: int) -> tuple[float, int, bool] | None:
        c, r0 = self.choices[j], int(self.x[j].sum())
        here = self._here(j)
        free, shared = self._room(j)
        best: tuple[float, int, bool] | None = None
        top = min(c.top, int(free.sum()))
        if top > r0:
            r = np.arange(r0 + 1, top + 1)
            n, ok = self._hosts_needed(r, free, shared)
            if ok.any():
                gain = (here - c.costs(n[ok], r[ok])) / (r[ok] - r0)
                i = int(np.argmax(gain))
                if gain[i] > 0:
                    best = (float(gain[i]), int(r[ok][i]), False)
        if c.keep is not None and not self.kept[j] and self._fits_prev(j, free, shared):
            added = int(c.prev.sum()) - r0
            g = (here - c.keep) / added if added > 0 else (np.inf if c.keep < here else 0.0)
            if g > 0 and (best is None or g >= best[0]):
                best = (float(g), int(c.prev.sum()), True)
        return best

    def apply(self, j: int, r: int, keep: bool) -> None:
        if keep:
            self.x[j], self.kept[j] = self.choices[j].prev, True
            return
        free, shared = self._room(j)
        spot = place(r, free, shared, self.hosts_known)
        if spot is not None:
            self.x[j], self.kept[j] = spot, False

    def total(self, x: np.ndarray) -> float:
        """The objective's sum for a whole matrix (kept rows cost their unpenalised value)."""
        return sum(self._cost_of(j, x[j]) for j in range(len(self.choices)))

    def _cost_of(self, j: int, row: np.ndarray) -> float:
        c, r = self.choices[j], int(row.sum())
        if c.keep is not None and (row == c.prev).all():
            return c.keep
        return c.zero if r == 0 else float(c.costs(np.array([np.count_nonzero(row)]), np.array([r]))[0])

    def polish(self, x: np.ndarray, passes: int = 3) -> np.ndarray:
        """Best responses: each job in turn takes its cheapest option with the others held fixed."""
        self.x = x.copy()
        for _ in range(passes):
            moved = False
            for j, c in enumerate(self.choices):
                now = self._cost_of(j, self.x[j])
                row = self.x[j].copy()
                self.x[j] = 0
                free, shared = self._room(j)
                best, best_cost = np.zeros_like(row), c.zero
                if c.keep is not None and c.keep < best_cost and self._fits_prev(j, free, shared):
                    best, best_cost = c.prev, c.keep
                top = min(c.top, int(free.sum()))
                if top >= 1:
                    r = np.arange(1, top + 1)
                    n, ok = self._hosts_needed(r, free, shared)
                    if ok.any():
                        cost = c.costs(n[ok], r[ok])
                        i = int(np.argmin(cost))
                        if cost[i] < best_cost:
                            spot = place(int(r[ok][i]), free, shared, self.hosts_known)
                            if spot is not None:
                                best, best_cost = spot, float(cost[i])
                if best_cost < now - 1e-12:
                    self.x[j], moved = best, True
                else:
                    self.x[j] = row
            if not moved:
                break
        return self.x

    def run(self) -> np.ndarray:
        heap: list[tuple[float, int, int, bool]] = []
        for j in range(len(self.choices)):
            if step := self.best_step(j):
                heapq.heappush(heap, (-step[0], j, step[1], step[2]))
        while heap:
            _, j, r, keep = heapq.heappop(heap)
            step = self.best_step(j)  # free workers may have changed since this entry was pushed
            if step is None:
                continue
            if (step[1], step[2]) != (r, keep):
                heapq.heappush(heap, (-step[0], j, step[1], step[2]))
                continue
            self.apply(j, r, keep)
            if step := self.best_step(j):
                heapq.heappush(heap, (-step[0], j, step[1], step[2]))
        return self.x.copy()


def _count_greedy(choices: list[_Choice], capacity: np.ndarray, hosts_known: bool) -> np.ndarray:
    """Replica counts first (each assumed on the fewest hosts), by marginal gain per worker; then
    placed: kept jobs where they were, the largest next, each on the fewest hosts left."""
    count = [0] * len(choices)
    keep = [False] * len(choices)
    free = int(capacity.sum())
    tables = []
    for c in choices:
        r = np.arange(c.top + 1)
        cost = c.costs(fewest_hosts(r, capacity), r) if c.top else np.zeros(1)
        cost[0] = c.zero
        tables.append(cost)

    def best_step(j: int) -> tuple[float, int, bool] | None:
        cost, c, r0 = tables[j], choices[j], count[j]
        here = c.keep if keep[j] and c.keep is not None else cost[r0]
        top = min(len(cost) - 1, r0 + free)
        best: tuple[float, int, bool] | None = None
        if top > r0:
            r = np.arange(r0 + 1, top + 1)
            gain = (here - cost[r0 + 1 : top + 1]) / (r - r0)
            i = int(np.argmax(gain))
            if gain[i] > 0:
                best = (float(gain[i]), int(r[i]), False)
        r_prev = int(c.prev.sum())
        if c.keep is not None and not keep[j] and r0 < r_prev <= r0 + free:
            g = (here - c.keep) / (r_prev - r0)
            if g > 0 and (best is None or g >= best[0]):
                best = (float(g), r_prev, True)
        return best

    heap: list[tuple[float, int, int, bool]] = []
    for j in range(len(choices)):
        if step := best_step(j):
            heapq.heappush(heap, (-step[0], j, step[1], step[2]))
    while heap and free > 0:
        _, j, r, is_keep = heapq.heappop(heap)
        step = best_step(j)
        if step is None:
            continue
        if (step[1], step[2]) != (r, is_keep):
            heapq.heappush(heap, (-step[0], j, step[1], step[2]))
            continue
        free -= r - count[j]
        count[j], keep[j] = r, is_keep
        if step := best_step(j):
            heapq.heappush(heap, (-step[0], j, step[1], step[2]))
    x = np.zeros((len(choices), len(capacity)), dtype=int)
    room = capacity.copy()
    shared = np.zeros(len(capacity), dtype=bool)
    for j in (j for j in range(len(choices)) if keep[j]):
        x[j] = choices[j].prev
        room -= x[j]
        shared |= (x[j] > 0) & (np.count_nonzero(x[j]) > 1)
    for j in sorted((j for j in range(len(choices)) if not keep[j] and count[j]), key=lambda j: -count[j]):
        for r in range(count[j], max(choices[j].job.min_replicas, 1) - 1, -1):
            spot = place(r, room, shared, hosts_known)
            if spot is not None:
                x[j] = spot
                room -= spot
                shared |= (spot > 0) & (np.count_nonzero(spot) > 1)
                break
    return x
