"""``lab.launch``'s training loop as a ``train(ctx)``: the loop a user would write for a model, its
data of ``(input, target)`` pairs, one loss and an optimizer factory, run through the same context
as a user's own loop (``Lab.run``; runtime/own_loop.py), so both share every strategy, record,
checkpoint and fault path."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from distlab.runtime.data import call_model


def default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Integer targets: cross-entropy over the last dimension (classification and language models
    alike). Floating-point targets: mean-squared error (regression; an output of one value per
    sample meets a target of none)."""
    if target.is_floating_point():
        if output.shape != target.shape and output.numel() == target.numel():
            output = output.reshape(target.shape)
        return F.mse_loss(output, target)
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def default_optimizer(params: list) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01)


@dataclass
class BuiltinLoop:
    """``train(ctx)`` for ``steps`` optimizer steps of ``loss(model(x), y)`` over ``data``: each step's
    record gets the mean loss of its micro-batches (the strategy's accumulation: the prepared
    loader yields them, the prepared optimizer steps after the last)."""

    model: torch.nn.Module
    data: Any
    steps: int
    batch_size: int
    shuffle: bool
    loss: Callable[[Any, Any], Any] | None = None
    optimizer: Callable[[Any], Any] | None = None

    @classmethod
    def of(cls, job: Any) -> BuiltinLoop:
        """The loop of a ``RankJob`` built for distlab's loop (its model, data, loss and optimizer)."""
        b = int(job.batch_size or job.strategy.batch.per_replica)
        return cls(job.model, job.data, job.steps, b, job.shuffle, job.loss, job.optimizer)

    def __call__(self, ctx: Any) -> int:
        from torch.utils.data import DataLoader

        opt = (self.optimizer or default_optimizer)(list(self.model.parameters()))
        loader = DataLoader(self.data, batch_size=self.batch_size, shuffle=self.shuffle)
        model, opt, loader = ctx.prepare(self.model, opt, loader)
        loss_fn = self.loss or default_loss
        total, micro = 0.0, 0
        while ctx.step < self.steps:
            for x, y in loader:
                step = ctx.step
                loss = loss_fn(call_model(model, x), y)
                loss.backward()
                total, micro = total + float(loss.detach()), micro + 1
                opt.step()  # the strategy's step after a step's last micro-batch, else nothing
                if ctx.step != step:
                    opt.zero_grad()
                    if math.isfinite(total):  # a diverged step's record keeps its loss NaN
                        ctx.report(loss=total / micro)
                    total, micro = 0.0, 0
                    if ctx.step >= self.steps:
                        break
        return ctx.step
