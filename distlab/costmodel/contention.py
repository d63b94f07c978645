"""Compute slowdown when ranks share a host's cores: fewer threads per rank, time-slicing, interference.

On a CPU host with ``c`` cores and ``n`` ranks, each rank runs ``t = max(1, c // n)`` threads
(what the launcher gives a worker). Relative to the profile, measured with ``T`` threads alone:

- fewer threads: ``(T / t) ** e``, with ``e`` the parallel efficiency exponent (1: perfect
  scaling with threads, 0: none), so a model profiled on 2 threads runs ~2**e slower per rank
  when two ranks split two cores;
- time-slicing: ``max(1, n * t / c)`` when ranks outnumber cores;
- interference: ``1 + contention * (min(n, c) - 1)`` for memory bandwidth and caches shared by
  the busy cores (measured by calibration: a GEMM alone vs with every rank busy, plus what the
  training-loop stage adds for a real model);
- oversubscription: ``1 + oversubscription * (n * t / c - 1)`` when ranks outnumber cores, for
  what time-slicing costs beyond sharing (context switches, caches, a rank descheduled while its
  peers wait for it in a collective); fitted by the training-loop stage of calibration.
"""

from __future__ import annotations

from distlab.strategy.execution import rank_threads


def time_slicing(ranks_on_host: int, cores: int | None) -> float:
    """How many ranks take turns on each core: ``max(1, n t / c)`` (1 when ranks fit the cores)."""
    n = max(int(ranks_on_host), 1)
    c = int(cores) if cores else n
    return max(1.0, n * rank_threads(n, c) / c)


def slowdown(
    ranks_on_host: int,
    cores: int | None,
    contention: float,
    profile_threads: int | None = None,
    thread_efficiency: float = 0.8,
    oversubscription: float = 0.0,
) -> float:
    """How much slower one rank computes than the profile says (see module docstring)."""
    n = max(int(ranks_on_host), 1)
    c = int(cores) if cores else n
    t = rank_threads(n, c)
    threads = (profile_threads / t) ** thread_efficiency if profile_threads else 1.0
    sliced = time_slicing(n, c)
    return threads * sliced * (1.0 + contention * (min(n, c) - 1)) * (1.0 + oversubscription * (sliced - 1.0))
