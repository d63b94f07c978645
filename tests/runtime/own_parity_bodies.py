"""Importable ranks for test_own_parity.py: one job run twice in one process group, by distlab's loop
(``RankJob`` without ``train_fn``: ``lab.launch``'s) and by a loop as a user writes it (``UserLoop``),
so every record and weight of the two can be compared."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from runtime_bodies import make_job, strategy_for
from torch.utils.data import TensorDataset

from distlab.runtime.job import RankJob, RunOptions
from distlab.step_metrics import StepMetric

PARITY_STEPS = 6
PATHS = ("builtin", "own")


def wide_model() -> torch.nn.Module:
    """Enough compute per step (about a millisecond) that a straggler's wait is measured in it."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10))


def wide_data(n: int = 1024) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 128, generator=g), torch.randint(0, 10, (n,), generator=g))


def _wide_job(rank: int, world: int, addr: str, port: int, ddp: bool, tag: str, **options: Any) -> RankJob:
    model = wide_model()
    return RankJob(
        rank=rank,
        world=world,
        master_addr=addr,
        master_port=port,
        strategy=strategy_for("builder:AllReduce", model, world),
        model=model,
        steps=PARITY_STEPS,
        data=wide_data(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.05),
        batch_size=32,
        seed=3,
        run_id=tag,
        timeout=30.0,
        options=RunOptions(ddp=ddp, **options),
    )


@dataclasses.dataclass
class UserLoop:
    """A plain user loop over the job's model and data: SGD-style ``zero_grad``, ``backward``, ``step``,
    the loss reported each step; with ``accuracy``, its own count of right answers reported too
    (what the ``accuracy`` metric must measure)."""

    model: torch.nn.Module
    data: Any
    steps: int
    batch: int
    optimizer: Any
    accuracy: bool = False

    def __call__(self, ctx: Any) -> int:
        from torch.utils.data import DataLoader

        opt = self.optimizer(list(self.model.parameters()))
        loader = DataLoader(self.data, batch_size=self.batch, shuffle=True)
        model, opt, loader = ctx.prepare(self.model, opt, loader)
        while ctx.step < self.steps:
            for x, y in loader:
                out = model(x)
                loss = F.cross_entropy(out, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                ctx.report(loss=loss.item())
                if self.accuracy:
                    ctx.report(own_accuracy=(out.argmax(-1) == y).float().mean().item())
                if ctx.step >= self.steps:
                    break
        return ctx.step


def parity_job(rank: int, world: int, addr: str, port: int, case: str, tag: str) -> RankJob:
    """The case's job: ``watched`` (DDP, accuracy, a trace, rank 1 three times slower), ``jitter``
    (distlab's buckets, every rank's compute varied), else a ``runtime_bodies`` case (strategy+flags)."""
    if case == "watched":
        metrics = (StepMetric("accuracy"),)
        return _wide_job(
            rank, world, addr, port, True, tag, metrics=metrics, trace=True, slowdown=((1, 3.0),)
        )
    if case == "jitter":
        return _wide_job(rank, world, addr, port, False, tag, jitter=1.0)
    return make_job(rank, world, addr, port, case, "dense", "sgd", PARITY_STEPS, tag=tag)


def parity_body(rank: int, world: int, addr: str, port: int, cases: list[str]) -> dict:
    """Per case and path: this rank's records and final weights."""
    from distlab.runtime.trainer import run_rank

    out: dict[tuple[str, str], dict] = {}
    for case in cases:
        for path in PATHS:
            job = parity_job(rank, world, addr, port, case, f"{case}-{path}")
            if path == "own":
                b = int(job.batch_size or job.strategy.batch.per_replica)
                user = UserLoop(job.model, job.data, job.steps, b, job.optimizer, bool(job.options.metrics))
                # the user's loop builds the strategy's optimizers like its own (lab.run's way)
                job = dataclasses.replace(job, train_fn=user, optimizer=None)
            res = run_rank(job)
            out[(case, path)] = {
                "records": res["records"],
                "weights": {k: v.detach().clone() for k, v in job.model.state_dict().items()},
            }
    return out
