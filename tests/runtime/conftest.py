"""The runtime tests' shared ranks: one spawn for the window and gossip suites, one per world
size for the equivalence and accumulation cases."""

from __future__ import annotations

import pytest
from runtime_bodies import ACCUMULATION_CASES, EQUIVALENCE_CASES, EQUIVALENCE_STEPS, equivalence_body
from window_bodies import GOSSIP_WORLD, gossip_ranks_body

from distlab.runtime.spawn import spawn_local

SYNC_DIGITS_STEPS = 60  # test_runtime_gossip.py's digits training
ASYNC_DIGITS_STEPS = 60  # test_window.py's asynchronous digits training


@pytest.fixture(scope="session")
def gossip_ranks() -> list[dict]:
    """Per rank, what ``gossip_ranks_body`` returns: the window operations ("windows"),
    synchronous gossip ("sync") and asynchronous gossip ("async"), on 4 ranks with a thread each.
    One spawn instead of three: each spawn of 4 ranks imports torch four times on 2 cores."""
    # about 40 s on a quiet 2-core machine, 100 s beside another test run; the tests that wait
    # for it allow 600 s (a test's timeout counts the fixture it waits for)
    steps = (SYNC_DIGITS_STEPS, ASYNC_DIGITS_STEPS)
    return spawn_local(GOSSIP_WORLD, gossip_ranks_body, *steps, timeout=540, threads=1)


@pytest.fixture(scope="session")
def equivalence_ranks():
    """``at(world)``: per rank, ``equivalence_body``'s results for test_runtime_equivalence.py's
    cases and (at 1 and 2 ranks, the worlds test_accumulation.py checks) its accumulation cases,
    spawned once per world size: a spawn costs each rank a torch import on 2 cores."""
    done: dict[int, list] = {}

    def at(world: int) -> list:
        if world not in done:
            cases = EQUIVALENCE_CASES + (ACCUMULATION_CASES if world in (1, 2) else [])
            done[world] = spawn_local(world, equivalence_body, cases, EQUIVALENCE_STEPS, timeout=540)
        return done[world]

    return at
