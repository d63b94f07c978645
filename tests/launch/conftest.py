"""An in-process Dask cluster for launch tests, with a timeout and leak checks (after dask's gen_cluster)."""

from __future__ import annotations

import sys
import threading
import time

import cloudpickle
import pytest
import torch

from distlab.strategy.types import RankSpec, Strategy, Sync, VariablePlan

# Test modules are not importable on the workers: ship their functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def spmd_workers(client) -> dict:
    from distlab.launch.spmd import workers_info

    return workers_info(client)


def _leaks(lab) -> dict:
    from distlab.launch import spmd

    return spmd.active_on_cluster(lab.client)


@pytest.fixture(scope="module")
def lab():
    """One 2-worker embedded Lab per test module (starting one costs seconds on 2 cores)."""
    from distlab.launch import Lab

    threads_before = {t.ident for t in threading.enumerate()}
    lab = Lab(workers=2, timeout=20)
    yield lab
    lab.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        extra = [
            t
            for t in threading.enumerate()
            if t.ident not in threads_before and t.is_alive() and t.name.startswith("distlab-run")
        ]
        if not extra:
            break
        time.sleep(0.1)
    assert not extra, f"run driver threads left behind: {[t.name for t in extra]}"


def _wait_for_workers(lab, n: int = 2, within: float = 60) -> None:
    """A killed or restarted worker comes back through its nanny, cold: wait until the cluster is whole."""
    deadline = time.monotonic() + within
    while len(spmd_workers(lab.client)) != n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(spmd_workers(lab.client)) == n, (
        f"the cluster has {len(spmd_workers(lab.client))} workers, not {n}"
    )


@pytest.fixture
def clean_lab(lab):
    """The module's Lab, checked before and after the test: whole, no rank left training, no run pending."""
    _wait_for_workers(lab)
    assert _leaks(lab) == {}, "a previous test left ranks training"
    yield lab
    deadline = time.monotonic() + 10
    while _leaks(lab) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leaks(lab) == {}, "ranks still training 10 s after the test ended"
    for run in lab._runs:
        assert run.done, f"run {run.id} still {run.status} after the test"


class TinyNet(torch.nn.Module):
    def __init__(self, d_in: int = 8, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Blobs(torch.utils.data.Dataset):
    """A learnable toy classification set: class k is a Gaussian blob around centre k."""

    def __init__(self, n: int = 512, d: int = 8, classes: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, classes, (n,), generator=g)
        centres = torch.randn(classes, d, generator=g) * 3
        self.x = centres[self.y] + torch.randn(n, d, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def allreduce_strategy(model, resources, world=None, batch=16) -> Strategy:
    from distlab.strategy.types import BatchConfig

    ranks = tuple(
        RankSpec(i, r.host, r.device) for i, r in enumerate(resources.ranks[: world or resources.world])
    )
    plans = tuple(VariablePlan(n, Sync("allreduce", group=0)) for n, p in model.named_parameters())
    return Strategy(plans, ranks, batch=BatchConfig(per_replica=batch), builder="AllReduce")


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return TinyNet()


@pytest.fixture
def blobs():
    return Blobs()
