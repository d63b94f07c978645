"""loop_pass_rank and overhead_rank on real gloo processes: lockstep, and figures a slow moment does not
move."""

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

        if dist.is_initialized() and dist.get_rank() == 0:
            time.sleep(SLOW)
        return self.fc(x)


def _rank_body(rank: int, world: int, port: int, out: mp.Queue) -> None:
    from distlab.runtime.loopbench import loop_pass_rank

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    local, loop = loop_pass_rank(
        rank, world, "127.0.0.1", port, [(RankZeroSleeps(), data, 4)], [1] * world, [], 30.0
    )
    out.put((rank, (local, loop)))


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [1, 3])
def test_ranks_wait_for_the_slowest_every_local_step(world):
    from distlab.runtime.loopbench import LOCAL_STEPS

    results = spawn_ranks(_rank_body, world, "loop_pass_rank ranks (a lockstep that never agreed?)")
    assert sorted(results) == list(range(world))
    for rank, (local, loop) in results.items():
        # LOCAL_STEPS steps (no more: no seconds asked) and no training-loop case
        assert loop == [] and len(local) == 1 and len(local[0]) == LOCAL_STEPS
        # alone, rank 0's step is its own sleep; in 3 ranks the others wait for it every step,
        # where ranks running freely would take ~0.1 ms
        assert statistics.median(local[0]) >= 0.8 * SLOW, (rank, local)


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
    from distlab.runtime.loopbench import loop_pass_rank, overhead_rank
    from distlab.strategy.types import RankSpec

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    # a slow step every fifth: in every pass, so the slower or faster pass cannot hide it
    local, _ = loop_pass_rank(
        rank, world, "127.0.0.1", port, [(Pauses(_every_fifth), data, 4)], [1], [], 30.0, 0.2
    )
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
    ((local, loop),) = spawn_ranks(_one_rank_body, 1, "the one-rank local step and loop").values()
    # the local step is the median step, as a run's throughput is measured: a slow step in
    # five (a pass's mean: >= PAUSE / 5) leaves it at the layer's own fraction of a millisecond
    assert statistics.median(local[0]) < PAUSE / 10, local
    # a case run in three passes keeps the two unhurried ones (median of every pass's steps);
    # run once, the slow moment is all there is
    assert statistics.median(loop[0]) < PAUSE / 2 and statistics.median(loop[1]) >= PAUSE, loop


def _loop_pass_body(rank: int, world: int, port: int, out: mp.Queue) -> None:
    import distlab as dl
    from distlab.resources import ResourceSpec
    from distlab.runtime.loopbench import LOCAL_STEPS, loop_pass_rank
    from distlab.strategy.types import RankSpec

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    model = RankZeroSleeps()
    two = ResourceSpec((RankSpec(0, "vm"), RankSpec(1, "vm")), cores={"vm": 2})
    strategy = dl.strategy.build("AllReduce", dl.profile(model, batch_size=4), two, batch_size=4)
    local, loop = loop_pass_rank(
        rank, world, "127.0.0.1", port, [(model, data, 4)], [1, 1], [(model, strategy, data, 4, 9, 1)], 30.0
    )
    out.put((rank, (local, loop, LOCAL_STEPS)))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_loop_pass_measures_the_local_step_beside_the_loop():
    results = spawn_ranks(_loop_pass_body, 2, "loop_pass_rank ranks")
    for rank, (local, loop, steps) in results.items():
        # the local steps: LOCAL_STEPS of them (no extra steps for short ones), in lockstep: rank 1
        # waits for rank 0's sleep every step, as it does in the training loop that follows
        assert len(local) == 1 and len(local[0]) == steps, local
        assert statistics.median(local[0]) >= 0.8 * SLOW, (rank, local)
        # the loop: one pass of 9 steps less its first third
        assert len(loop) == 1 and len(loop[0]) == 6, loop
        assert statistics.median(loop[0]) >= 0.8 * SLOW, (rank, loop)


def test_time_local_takes_steps_until_seconds_or_max_steps():
    """At least ``steps`` steps; beyond them, more while ``seconds`` last, up to ``max_steps``
    (a user's model is measured with a higher cap than the reference models)."""
    from distlab.runtime.loopbench import LOCAL_MAX_STEPS, _time_local

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))
    assert (
        len(_time_local(model, data, 4, 0, 1, 5, seconds=60.0, max_steps=9)) == 9
    )  # the cap, long before 60 s
    assert len(_time_local(model, data, 4, 0, 1, 5, seconds=60.0)) == LOCAL_MAX_STEPS  # the default cap
    assert len(_time_local(model, data, 4, 0, 1, 5, seconds=0.0, max_steps=9)) == 5  # no time: steps alone
    assert len(_time_local(model, data, 4, 0, 1, 12, seconds=60.0, max_steps=9)) == 12  # steps beat the cap
