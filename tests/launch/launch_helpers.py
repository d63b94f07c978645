"""Toy model, data and strategy shared by the launch tests (a module of its own, not conftest)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import cloudpickle
import torch

from distlab.strategy.types import RankSpec, Strategy, Sync, VariablePlan

# Test modules are not importable on the workers: ship their functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


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


class Gate:
    """A release the test gives the ranks, which run in other processes: a file that exists once
    released."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / "gate-released"

    def release(self) -> None:
        self.path.touch()


class HeldBlobs(Blobs):
    """Blobs whose reads stop after ``free`` samples in each process until the test releases
    ``gate``, then flow at full speed: a run is still running when the test acts on it, however
    fast the machine. A gate not released within ``hold`` seconds fails the read, loudly."""

    def __init__(self, gate: Gate, free: int, hold: float = 120.0) -> None:
        super().__init__()
        self.gate, self.free, self.hold = str(gate.path), free, hold
        self._reads, self._open = 0, False

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_reads": 0}  # the client's own reads (checks, profile) do not count

    def __getitem__(self, i):
        self._reads += 1
        if self._reads > self.free and not self._open:
            deadline = time.monotonic() + self.hold
            while not os.path.exists(self.gate):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"HeldBlobs: the test never released {self.gate} in {self.hold:g} s")
                time.sleep(0.005)
            self._open = True
        return super().__getitem__(i)


def allreduce_strategy(model, resources, world=None, batch=16) -> Strategy:
    from distlab.strategy.types import BatchConfig

    ranks = tuple(
        RankSpec(i, r.host, r.device) for i, r in enumerate(resources.ranks[: world or resources.world])
    )
    plans = tuple(VariablePlan(n, Sync("allreduce", group=0)) for n, p in model.named_parameters())
    return Strategy(plans, ranks, batch=BatchConfig(per_replica=batch), builder="AllReduce")
