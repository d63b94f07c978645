"""local_step_worlds and overhead_rank on real gloo processes: lockstep, and figures a slow moment does not move."""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time

import pytest
import torch

from .gloo_ranks import spawn_ranks

SLOW = 0.01  # seconds rank 0 sleeps in every forward


class RankZeroSleeps(torch.nn.Module):
    """A linear layer whose forward takes SLOW seconds longer on rank 0 of the default group."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if dist.get_rank() == 0:
            time.sleep(SLOW)
        return self.fc(x)


def _rank_body(rank: int, world: int, port: int, out: mp.Queue) -> None:
    from distlab.runtime.microbench import local_step_worlds

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    threads = {k: [1] * k for k in (1, 2, 3)}
    seconds = local_step_worlds(rank, world, "127.0.0.1", port, [(RankZeroSleeps(), data, 4)], [1, 2, 3], threads, 3, 30.0)
    out.put((rank, seconds))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_of_a_world_size_wait_for_the_slowest_every_step():
    results = spawn_ranks(_rank_body, 3, "local_step_worlds ranks (a lockstep that never agreed?)")
    # each rank reports the world sizes it was busy in: rank 0 in 1, 2, 3; rank 2 only in 3
    assert {r: sorted(s) for r, s in results.items()} == {0: [1, 2, 3], 1: [2, 3], 2: [3]}
    # alone, rank 0's step is its own sleep; in 2 and 3 ranks (a sub-group, then the whole
    # group) the others wait for it every step, where ranks running freely would take ~0.1 ms
    assert results[0][1][0] >= SLOW
    for k in (2, 3):
        for r in range(1, k):
            assert results[r][k][0] >= 0.8 * SLOW, (k, r, results[r][k])


PAUSE = 0.05  # seconds of a slow moment of the machine, injected into some forwards


class Pauses(torch.nn.Module):
    """A linear layer whose forward sleeps PAUSE on the calls ``slow(call number)`` picks."""

    def __init__(self, slow) -> None:
        super().__init__()
        self.fc, self.slow, self.calls = torch.nn.Linear(4, 3), slow, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.slow(self.calls):
            time.sleep(PAUSE)
        return self.fc(x)


def _every_fifth(n: int) -> bool:
    return n % 5 == 0


def _first_twelve(n: int) -> bool:
    return n <= 12


def _one_rank_body(rank: int, world: int, port: int, out: mp.Queue) -> None:
    import distlab as dl
    from distlab.resources import ResourceSpec
    from distlab.runtime.microbench import local_step_worlds, overhead_rank
    from distlab.strategy.types import RankSpec

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    # a slow step every fifth: in every pass, so the slower or faster pass cannot hide it
    local = local_step_worlds(rank, world, "127.0.0.1", port, [(Pauses(_every_fifth), data, 4)], [1], {1: [1]}, 10, 30.0)
    # the training loop: every step of a case's first pass slow (the machine busy for a moment)
    one = ResourceSpec((RankSpec(0, "vm"),), cores={"vm": 1})
    cases = []
    for passes in (3, 1):
        model = Pauses(_first_twelve)
        strategy = dl.strategy.build("AllReduce", dl.profile(model, batch_size=4), one, batch_size=4)
        model.calls = 0  # profiling ran it
        cases.append((model, strategy, data, 4, 12, passes))
    loop = overhead_rank(rank, world, "127.0.0.1", port, cases, 30.0)
    out.put((rank, (local, loop)))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_slow_moment_does_not_become_the_measured_step():
    (local, loop), = spawn_ranks(_one_rank_body, 1, "the one-rank local step and loop").values()
    # the local step is the median step, as a run's throughput is measured: a slow step in
    # five (a pass's mean: >= PAUSE / 5) leaves it at the layer's own fraction of a millisecond
    assert local[1][0] < PAUSE / 10, local
    # a case run in three passes keeps the two unhurried ones (median of every pass's steps);
    # run once, the slow moment is all there is
    assert statistics.median(loop[0]) < PAUSE / 2 and statistics.median(loop[1]) >= PAUSE, loop
