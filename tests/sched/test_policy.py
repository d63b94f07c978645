"""The goodput and FIFO policies on synthetic jobs (like pollux_test.py); bad allocations refused."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

import distlab.sched as sched
from distlab.errors import DistlabError, SchedulerError
from distlab.sched.artifact_goodput import GoodputFunction, SpeedupFunction

# pollux_test.py's "realistic speedup function"
PERF = (0.121, 0.00568, 0.0236, 0.00634, 0.0118, 0.00317, 1.14)
SPEEDUP = SpeedupFunction(GoodputFunction(PERF, (0.00136, 0.000502), 128), 1280, (64, 256))


def workers(hosts: int, slots: int) -> dict[str, str]:
    return sched.SimCluster(hosts, slots).workers


def spec(name: str, speedup=SPEEDUP, max_replicas: int = 8, age: float = 600.0, **kw) -> sched.JobSpec:
    return sched.JobSpec(name, speedup, max_replicas=max_replicas, age=age, **kw)


def distributed_per_host(alloc, pool) -> Counter:
    per = Counter()
    for ws in alloc.values():
        hosts = {pool[w] for w in ws}
        if len(hosts) > 1:
            per.update(hosts)
    return per


@pytest.mark.parametrize("hosts", [1, 2, 4, 8, 16])
def test_sixteen_jobs_on_sixteen_workers_each_get_one_and_stay_put(hosts):
    pool = workers(hosts, 16 // hosts)
    jobs = [spec(f"job{i}", submitted=float(i)) for i in range(16)]
    previous: dict = {}
    for _ in range(3):
        alloc = sched.allocate(jobs, pool, previous)
        assert sorted(len(ws) for ws in alloc.values()) == [1] * 16  # fairness: nobody waits
        assert max(distributed_per_host(alloc, pool).values(), default=0) <= 1
        if previous:
            assert alloc == previous  # nothing to gain from a restart
        previous = alloc


def test_few_jobs_get_more_workers_with_one_distributed_job_per_host():
    pool = workers(4, 4)
    jobs = [spec(f"job{i}", max_replicas=16, submitted=float(i)) for i in range(3)]
    alloc = sched.allocate(jobs, pool)
    assert sum(len(ws) for ws in alloc.values()) == 16
    assert all(3 <= len(ws) <= 8 for ws in alloc.values())
    assert max(distributed_per_host(alloc, pool).values(), default=0) <= 1


def _brute_force(policy, jobs, pool, previous):
    """The best value over every jobs x hosts count matrix within capacity, max_replicas and the
    one-distributed-job-per-host rule."""
    hosts = sorted(set(pool.values()))
    slots = {h: sorted(w for w, x in pool.items() if x == h) for h in hosts}
    per_job = [
        [
            c
            for c in itertools.product(range(len(slots[hosts[0]]) + 1), repeat=len(hosts))
            if sum(c) <= j.max_replicas
        ]
        for j in jobs
    ]
    best = -1.0
    for combo in itertools.product(*per_job):
        counts = np.array(combo)
        if (counts.sum(axis=0) > [len(slots[h]) for h in hosts]).any():
            continue
        spread = (counts > 0).sum(axis=1) > 1
        if ((counts[spread] > 0).sum(axis=0) > 1).any():
            continue
        used = {h: 0 for h in hosts}
        alloc = {}
        for j, row in zip(jobs, counts):
            ws = []
            for h, k in zip(hosts, row):
                ws += slots[h][used[h] : used[h] + k]
                used[h] += k
            if ws:
                alloc[j.name] = tuple(ws)
        best = max(best, policy.value(jobs, pool, alloc, previous))
    return best


def _sublinear(a: float):
    return lambda n, r: r / (1 + a * (r - 1)) * np.where(n > 1, 0.8, 1.0)


@pytest.mark.parametrize("seed", range(4))
def test_the_greedy_reaches_the_exhaustive_optimum_of_pollux_objective(seed):
    rng = np.random.default_rng(seed)
    pool = workers(2, 3)
    jobs = [
        spec(
            f"j{i}",
            _sublinear(float(rng.uniform(0.0, 0.6))),
            max_replicas=int(rng.integers(1, 7)),
            submitted=i,
        )
        for i in range(3)
    ]
    previous = {"j0": ("h00/w0", "h00/w1")} if seed % 2 else {}
    policy = sched.GoodputPolicy()
    got = policy.value(jobs, pool, sched.allocate(jobs, pool, previous), previous)
    assert got >= 0.97 * _brute_force(policy, jobs, pool, previous)


def test_a_job_that_scales_gets_more_than_one_that_does_not_but_both_run():
    pool = workers(2, 4)
    jobs = [spec("linear", None, max_replicas=8), spec("flat", _sublinear(0.9), max_replicas=8)]
    alloc = sched.allocate(jobs, pool)
    assert len(alloc["linear"]) > len(alloc["flat"]) >= 1


def test_restart_penalty_keeps_a_young_job_where_it_is():
    pool = workers(1, 8)
    previous = {"old": tuple(f"h00/w{k}" for k in range(4))}
    young = [spec("old", None, age=20.0, restarts=0), spec("new", None, age=600.0)]
    assert sched.allocate(young, pool, previous)["old"] == previous["old"]
    grown = [spec("old", None, age=3600.0), spec("new", None, age=600.0)]
    assert len(sched.allocate(grown, pool, previous)["old"]) == 4  # 4 + 4: the fair split of 8


def test_min_replicas_is_all_or_nothing():
    pool = workers(1, 4)
    jobs = [spec("big", None, min_replicas=6, max_replicas=8), spec("small", None, max_replicas=2)]
    alloc = sched.allocate(jobs, pool)
    assert "big" not in alloc and len(alloc["small"]) == 2


def test_workers_without_hosts_are_allocated_too():
    alloc = sched.allocate(
        [spec("a", None, max_replicas=3), spec("b", None, max_replicas=3)], ["w0", "w1", "w2"]
    )
    assert sorted(len(v) for v in alloc.values()) == [1, 2]


def test_fifo_starts_jobs_in_order_keeps_them_and_blocks_behind_the_head():
    pool = workers(2, 4)
    jobs = [
        spec("first", max_replicas=6, submitted=0.0),
        spec("second", max_replicas=4, submitted=1.0),
        spec("third", max_replicas=1, submitted=2.0),
    ]
    alloc = sched.allocate(jobs, pool, policy="fifo")
    assert list(alloc) == ["first"] and len(alloc["first"]) == 6  # "third" would fit, but waits in line
    again = sched.allocate(
        [*jobs, spec("zeroth", max_replicas=8, submitted=-1.0)], pool, alloc, policy="fifo"
    )
    assert again["first"] == alloc["first"]  # never preempted


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"a": ("h00/w0",), "b": ("h00/w0",)}, "over capacity"),
        ({"ghost": ("h00/w0",)}, "unknown job 'ghost'"),
        ({"a": ("h09/w9",)}, "unknown worker"),
        ({"a": ("h00/w0", "h00/w1", "h00/w2")}, "max_replicas=2"),
        ([("a", "h00/w0")], "return a dict"),
    ],
)
def test_a_bad_allocation_is_refused_with_the_fault_named(bad, words):
    jobs = [spec("a", max_replicas=2), spec("b", max_replicas=2)]
    with pytest.raises(SchedulerError, match=words) as err:
        sched.check_allocation(bad, jobs, workers(1, 4))
    assert isinstance(err.value, DistlabError)


def test_policies_by_name_or_object_and_a_clear_error_otherwise():
    assert isinstance(sched.get_policy("goodput"), sched.GoodputPolicy)
    assert isinstance(sched.get_policy("fifo"), sched.FifoPolicy)
    with pytest.raises(SchedulerError, match="'goodput', 'fifo'|'fifo', 'goodput'"):
        sched.get_policy("tiresias")
    with pytest.raises(SchedulerError, match="no allocate"):
        sched.get_policy(object())


def test_bad_job_specs_name_the_field():
    with pytest.raises(SchedulerError, match="max_replicas=0"):
        sched.JobSpec("x", max_replicas=0)
    with pytest.raises(SchedulerError, match="min_replicas=3"):
        sched.JobSpec("x", min_replicas=3, max_replicas=2)


@pytest.mark.parametrize("policy", ["goodput", "fifo"])
def test_two_jobs_with_one_name_are_refused(policy):
    with pytest.raises(SchedulerError, match=r"\['twin'\] appear more than once"):
        sched.allocate([spec("twin"), spec("twin")], workers(1, 2), policy=policy)
