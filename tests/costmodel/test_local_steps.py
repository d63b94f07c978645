"""local_step_worlds on 3 real gloo processes: each world size's ranks step in lockstep."""

from __future__ import annotations

import multiprocessing as mp
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
