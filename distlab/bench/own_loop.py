"""The own-loop benchmark's programs: ``lab.launch``, ``lab.run`` of a plain user loop and plain DDP on
the same model, data, loss and optimizer, each measured as rank 0's samples/s after warm-up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from distlab.bench.ddp import ddp_only_body, run_span_throughput

LR = 0.01  # ddp_loop's SGD: every program steps the same optimizer


@dataclass
class PlainLoop:
    """``train(ctx)`` as a torch user writes it: SGD, a shuffled DataLoader, cross-entropy, the loss
    reported every step (``loss.item()``, as a loop that logs it does), ``steps`` optimizer steps.

    A class rather than a closure so the notebook's loop travels to the ranks by reference to this
    module, with only its fields pickled."""

    model: torch.nn.Module
    dataset: Any
    batch: int
    steps: int
    lr: float = LR

    def __call__(self, ctx: Any) -> int:
        from torch.utils.data import DataLoader

        opt = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        loader = DataLoader(self.dataset, batch_size=self.batch, shuffle=True)
        model, opt, loader = ctx.prepare(self.model, opt, loader)
        while ctx.step < self.steps:
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                ctx.report(loss=loss.item())
                if ctx.step >= self.steps:
                    break
        return ctx.step


def sgd(params: Any) -> torch.optim.Optimizer:
    """The optimizer ``lab.launch`` gets here: ``PlainLoop``'s and ``ddp_loop``'s (launch's own default,
    Adam at 1e-3, costs more per step than SGD on a large model and would not compare like for like)."""
    return torch.optim.SGD(params, lr=LR)


def samples_for(batch: int, world: int, steps: int) -> int:
    """The data set's size: as ``ddp_only_body`` builds its own (every program reads the same samples)."""
    return max(4096, batch * world * steps)


def build_case(options: dict[str, Any], batch: int, world: int, steps: int) -> tuple[torch.nn.Module, Any]:
    """The zoo MLP of ``options`` (seed 0) and its synthetic data, as ``ddp_only_body`` builds them."""
    from distlab import data, zoo

    model = zoo.get("mlp", seed=0, **options)
    return model, data.synthetic(model, n=samples_for(batch, world, steps), seed=0)


def launch_throughput(
    lab: Any, model: Any, dataset: Any, batch: int, steps: int, warmup: int, elastic: bool = True
) -> tuple[float, Any]:
    """``lab.launch`` under AllReduce with its defaults (cross-entropy, shuffled, elastic checkpoints)
    but the optimizer: ``sgd``, as the loop's. Samples/s and the run."""
    run = lab.launch(
        model,
        strategy="AllReduce",
        steps=steps,
        data=dataset,
        batch_size=batch,
        optimizer=sgd,
        elastic=elastic,
    ).wait(1800, progress=False)
    return run_span_throughput(run, warmup), run


def own_throughput(
    lab: Any, model: Any, dataset: Any, batch: int, steps: int, warmup: int, elastic: bool = True
) -> tuple[float, Any]:
    """``lab.run`` of ``PlainLoop`` under AllReduce with its defaults: samples/s and the run."""
    run = lab.run(PlainLoop(model, dataset, batch, steps), strategy="AllReduce", elastic=elastic)
    run.wait(1800, progress=False)
    return run_span_throughput(run, warmup), run


def ddp_throughput(world: int, options: dict[str, Any], batch: int, steps: int, warmup: int) -> float:
    """Plain DDP on ``world`` fresh processes (``ddp_only_body``): rank 0's samples/s."""
    from distlab.runtime.spawn import spawn_local

    out = spawn_local(world, ddp_only_body, "mlp", options, batch, steps, warmup, timeout=1800)
    return float(out[0]["samples_per_s"])


def last_checkpoint(run: Any) -> int | None:
    """The step of the run's last checkpoint (None: it took none)."""
    return run.last_checkpoint["step"] if run.last_checkpoint else None
