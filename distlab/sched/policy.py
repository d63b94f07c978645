"""What a scheduling policy sees and returns (jobs, workers, allocations), and the check that refuses one.

Vocabulary (Pollux, Qiao et al. OSDI 2021): a *job* asks for replicas; a *worker* is one slot that
runs one replica; a *host* holds several workers. An *allocation* maps each job to the workers its
replicas run on; a job absent from it (or given no workers) waits. A job's *speedup* is a function
``speedup(nodes, replicas)`` of how many hosts and replicas it gets, vectorised over numpy arrays;
one that also has ``strategy_at(nodes, replicas)`` (``sched.speedup.StrategySpeedup``) names the
strategy it would run there, and the allocation then says which strategy each job runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from distlab.errors import SchedulerError

SpeedupFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


Allocation = dict[str, tuple[str, ...]]


class Allocated(dict[str, tuple[str, ...]]):
    """What the policies and ``check_allocation`` return: an Allocation ``{job: workers}`` and
    ``strategies``, ``{job: strategy name}`` for the jobs whose speedup names one (empty otherwise).
    A job whose workers did not change keeps its strategy."""

    def __init__(self, *args: object, strategies: Mapping[str, str] | None = None, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.strategies: dict[str, str] = dict(strategies or {})


@dataclass(frozen=True)
class JobSpec:
    """One job as a policy sees it at one scheduling round.

    What a caller (the Lab's scheduler) fills each round: ``name`` (unique), ``max_replicas``
    (``min_replicas`` for a job that cannot run smaller), ``submitted``, ``age``, ``restarts`` and
    ``attained`` from its history; ``speedup``: None (linear), any function, or a
    ``sched.speedup.StrategySpeedup`` (the cost model before it runs, ``with_measurements`` after),
    with which the allocation's ``strategies`` names the strategy per job; ``restart_cost``:
    ``sched.restart.restart_seconds(checkpoint_bytes(profile), relaunch, *measure_storage())``;
    ``strategy``: the one it runs now.
    """

    name: str
    speedup: SpeedupFn | None = None
    """``speedup(nodes, replicas)`` (numpy arrays in, same shape out); None: linear, ``replicas``."""
    min_replicas: int = 0
    """A job gets no workers or at least this many."""
    max_replicas: int = 1
    """The most workers it can use (Pollux caps a job at twice what it has been profiled at)."""
    submitted: float = 0.0
    """When it arrived (seconds): FIFO order, and the tie-break of the goodput policy."""
    age: float = 0.0
    """Seconds since it arrived: the restart penalty weighs a restart against it."""
    restarts: int = 0
    """How often its allocation changed since it first started."""
    attained: float = 0.0
    """Worker-seconds it has held so far (less-served jobs come first on ties, as in Pollux)."""
    restart_cost: float | None = None
    """Seconds a restart costs this job (``sched.restart.restart_seconds``: its checkpoint's size
    and a measured warm relaunch); None: the policy's ``restart_delay``."""
    strategy: str | None = None
    """The strategy it runs now: kept while its workers are unchanged."""

    def __post_init__(self) -> None:
        if self.max_replicas < 1:
            raise SchedulerError(f"job {self.name!r}: max_replicas={self.max_replicas}; give at least 1")
        if self.restart_cost is not None and not self.restart_cost >= 0:
            raise SchedulerError(
                f"job {self.name!r}: restart_cost={self.restart_cost}; give the seconds a restart costs "
                "(>= 0)"
            )
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise SchedulerError(
                f"job {self.name!r}: min_replicas={self.min_replicas} is not in [0, max_replicas="
                f"{self.max_replicas}]; lower min_replicas or raise max_replicas"
            )

    def speedups(self, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        """The job's speedup at each (nodes, replicas) pair; 0 where replicas is 0."""
        nodes = np.asarray(nodes, dtype=int)
        replicas = np.asarray(replicas, dtype=int)
        if self.speedup is None:
            return replicas.astype(float)
        out = np.zeros(replicas.shape, dtype=float)
        used = replicas > 0
        if used.any():
            values = np.asarray(self.speedup(nodes[used], replicas[used]), dtype=float)
            out[used] = np.where(np.isfinite(values), np.maximum(values, 0.0), 0.0)
        return out


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: a pure function of the jobs, the workers and the previous allocation."""

    def allocate(
        self,
        jobs: Sequence[JobSpec],
        workers: Mapping[str, str] | Sequence[str],
        previous: Mapping[str, Sequence[str]],
    ) -> Mapping[str, Sequence[str]]:
        """Workers for each job (a job left out waits); ``workers`` maps each worker to its host."""
        ...


@dataclass(frozen=True)
class Layout:
    """The workers grouped by host, in a fixed order (hosts sorted, workers sorted within a host)."""

    hosts: tuple[str, ...]
    slots: tuple[tuple[str, ...], ...]
    hosts_known: bool

    @classmethod
    def of(cls, workers: Mapping[str, str] | Sequence[str]) -> Layout:
        """From ``{worker: host}``; a plain list of workers means hosts are unknown (one host each)."""
        if isinstance(workers, Mapping):
            by_host: dict[str, list[str]] = {}
            for worker, host in workers.items():
                by_host.setdefault(str(host), []).append(str(worker))
            known = True
        else:
            by_host = {str(w): [str(w)] for w in workers}
            known = False
        hosts = tuple(sorted(by_host))
        return cls(hosts, tuple(tuple(sorted(by_host[h])) for h in hosts), known)

    @property
    def capacity(self) -> np.ndarray:
        return np.array([len(s) for s in self.slots], dtype=int)

    def host_of(self) -> dict[str, int]:
        return {w: i for i, ws in enumerate(self.slots) for w in ws}

    def counts(self, allocation: Mapping[str, Sequence[str]], names: Sequence[str]) -> np.ndarray:
        """Replicas of each named job on each host (jobs x hosts); unknown workers are skipped."""
        where = self.host_of()
        out = np.zeros((len(names), len(self.hosts)), dtype=int)
        for j, name in enumerate(names):
            for w in allocation.get(name, ()):
                if w in where:
                    out[j, where[w]] += 1
        return out

    def to_workers(
        self, counts: np.ndarray, names: Sequence[str], previous: Mapping[str, Sequence[str]]
    ) -> Allocated:
        """Concrete workers for a jobs x hosts count matrix; a job keeps the workers it had where it can."""
        out: dict[str, list[str]] = {n: [] for n in names}
        for h, slots in enumerate(self.slots):
            free = list(slots)
            wants = {j: int(counts[j, h]) for j in range(len(names)) if counts[j, h] > 0}
            # first the workers each job already holds on this host, so an unchanged job is untouched
            for j, k in wants.items():
                mine = [w for w in previous.get(names[j], ()) if w in free][:k]
                out[names[j]] += mine
                for w in mine:
                    free.remove(w)
                wants[j] = k - len(mine)
            for j, k in wants.items():
                out[names[j]] += free[:k]
                del free[:k]
        return Allocated({n: tuple(ws) for n, ws in out.items() if ws})


def name_strategies(
    allocation: Allocated,
    jobs: Sequence[JobSpec],
    workers: Mapping[str, str] | Sequence[str],
    previous: Mapping[str, Sequence[str]],
) -> Allocated:
    """``allocation`` with the strategy of every job whose speedup names one: the one it runs when
    its workers are unchanged, else the best at its new (hosts, replicas)."""
    host = Layout.of(workers).host_of()
    for job in jobs:
        chosen = allocation.get(job.name)
        pick = getattr(job.speedup, "strategy_at", None)
        if not chosen or pick is None:
            continue
        if job.strategy is not None and set(chosen) == set(previous.get(job.name, ())):
            allocation.strategies[job.name] = job.strategy
        else:
            allocation.strategies[job.name] = str(pick(len({host[w] for w in chosen}), len(chosen)))
    return allocation


def job_names(jobs: Sequence[JobSpec]) -> list[str]:
    """The jobs' names, or a SchedulerError when two jobs share one (allocations are keyed by name)."""
    names = [j.name for j in jobs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SchedulerError(f"jobs {twice} appear more than once; give every job its own name")
    return names


def check_allocation(
    allocation: Mapping[str, Sequence[str]],
    jobs: Sequence[JobSpec],
    workers: Mapping[str, str] | Sequence[str],
) -> Allocated:
    """The allocation as ``{job: workers}`` without empty entries, or a SchedulerError naming the fault.

    A caller that catches the error keeps its previous allocation (the scheduler's rule).
    """
    if not isinstance(allocation, Mapping):
        raise SchedulerError(
            f"the policy returned {type(allocation).__name__}; return a dict {{job name: [workers]}}"
        )
    job_names(jobs)
    specs = {j.name: j for j in jobs}
    known = set(workers)
    owner: dict[str, str] = {}
    out = Allocated()
    for name, chosen in allocation.items():
        if name not in specs:
            raise SchedulerError(
                f"the policy allocated to unknown job {name!r}; allocate only to {sorted(specs)}"
            )
        chosen = tuple(chosen)
        for w in chosen:
            if w not in known:
                raise SchedulerError(
                    f"job {name!r} got unknown worker {w!r}; use one of the cluster's workers"
                )
            if w in owner:
                raise SchedulerError(
                    f"worker {w!r} is given to both {owner[w]!r} and {name!r}: over capacity; "
                    "give each worker to one job"
                )
            owner[w] = name
        spec = specs[name]
        if len(chosen) > spec.max_replicas or 0 < len(chosen) < spec.min_replicas:
            raise SchedulerError(
                f"job {name!r} got {len(chosen)} workers, outside [min_replicas={spec.min_replicas}, "
                f"max_replicas={spec.max_replicas}]; give none or a count in that range"
            )
        if chosen:
            out[name] = chosen
    named = getattr(allocation, "strategies", None) or {}
    out.strategies = {k: str(v) for k, v in named.items() if k in out}
    return out


def place(replicas: int, free: np.ndarray, shared: np.ndarray, hosts_known: bool) -> np.ndarray | None:
    """Replicas per host for one job on the fewest hosts, or None when it does not fit.

    ``shared`` marks hosts that already hold a job spread over several hosts: Pollux keeps at most
    one such (distributed) job per host, because two of them contend for the host's network.
    """
    out = np.zeros_like(free)
    fits = np.flatnonzero(free >= replicas)
    if len(fits):
        # best fit on one host: the fullest host that still fits, so large holes stay for large jobs
        h = fits[np.argmin(free[fits])]
        out[h] = replicas
        return out
    eligible = free * (~shared if hosts_known else 1)
    order = np.argsort(-eligible, kind="stable")
    total = np.cumsum(eligible[order])
    if total[-1] < replicas:
        return None
    k = int(np.searchsorted(total, replicas)) + 1
    take = eligible[order[:k]].copy()
    take[-1] -= int(total[k - 1] - replicas)
    out[order[:k]] = take
    return out


def fewest_hosts(replicas: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """The fewest hosts ``replicas`` can span on hosts of these sizes (0 for 0 replicas)."""
    total = np.cumsum(np.sort(capacity)[::-1])
    return np.where(replicas > 0, np.searchsorted(total, replicas) + 1, 0)


def fair_replicas(workers: int, jobs: int) -> int:
    """Pollux's fair share: each of ``jobs`` jobs gets ``ceil(workers / jobs)`` workers."""
    return max(1, math.ceil(workers / max(jobs, 1)))
