"""The gradient noise scale of a model on its data, measured in this process before any run.

The picker's goodput for an adaptive strategy needs a noise scale before the run that would
measure it live. ``measure_noise_scale`` reads ``steps`` batches of ``micro x batch_size``
samples, takes each micro-batch's gradient of a copy of the model (the model itself, its
weights and its BatchNorm statistics are left as they are), and from the mean squared norm of
the micro-batch gradients and the squared norm of their mean gets unbiased |G|^2 and per-sample
tr(Sigma) per step (``two_batch_estimates``); the noise scale is the ratio of their means.

It measures the weights as they are: at initialisation the gradient is large and the noise scale
small (McCandlish et al. 2018: it grows as training goes on), so the figure is the noise scale
at the start of training, and the goodput computed from it is the goodput of the first epochs.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab.adaptive.noise import two_batch_estimates
from distlab.errors import DistlabError

MICRO = 4  # micro-batches per measured step: the small batch is one, the big batch all of them


@dataclass(frozen=True)
class NoiseMeasurement:
    """What ``measure_noise_scale`` found: ``noise_scale`` phi = tr(Sigma) / |G|^2 in samples,
    ``sqr`` |G|^2 and ``var`` per-sample tr(Sigma) (means over the steps), from ``steps`` steps of
    ``micro`` micro-batches of ``batch_size`` samples, in ``seconds``."""

    noise_scale: float
    sqr: float
    var: float
    steps: int
    batch_size: int
    micro: int
    seconds: float

    def __str__(self) -> str:
        return (
            f"noise scale {self.noise_scale:,.1f} samples (at the model's current weights; "
            f"{self.steps} steps of {self.micro} x {self.batch_size} samples, {self.seconds:.1f} s)"
        )


def measure_noise_scale(
    model: Any,
    data: Any = None,
    loss: Any = None,
    *,
    batch_size: int = 32,
    steps: int = 30,
    micro: int = MICRO,
    seed: int = 0,
) -> NoiseMeasurement:
    """The gradient noise scale of ``model`` (a torch ``nn.Module``) on ``data`` (a Dataset of
    (input, target) pairs, a DataLoader, or an ``(inputs, targets)`` pair) under ``loss`` (default:
    cross-entropy for integer targets, mean-squared error for float ones), from ``steps`` steps of
    ``micro`` micro-batches of ``batch_size`` samples read from a shuffled order. The model is
    not changed: a copy computes the gradients."""
    import torch

    from distlab.runtime.data import RankBatches, call_model
    from distlab.runtime.trainer import default_loss

    dataset = _checked(model, data, batch_size, steps, micro)
    probe = copy.deepcopy(model)
    probe.train()
    params = [p for p in probe.parameters() if p.requires_grad]
    if not params:
        raise DistlabError(f"measure_noise_scale: {type(model).__name__} has no trainable parameters")
    loss_fn = loss or default_loss
    batches = RankBatches(dataset, batch_size, 0, 1, True, seed, accumulation=micro)
    start = time.perf_counter()
    sqrs, vars_ = [], []
    for step in range(steps):
        grads = []
        for i in range(micro):
            x, y = batches.get(step * batches.global_batch, i)
            probe.zero_grad(set_to_none=True)
            value = loss_fn(call_model(probe, x), y)
            value.backward()
            grads.append(
                torch.cat(
                    [
                        (p.grad.to_dense() if p.grad.is_sparse else p.grad).reshape(-1)
                        for p in params
                        if p.grad is not None
                    ]
                ).double()
            )
        small = float(np.mean([float(g.pow(2).sum()) for g in grads]))
        big = float(torch.stack(grads).mean(0).pow(2).sum())
        sqr, var = two_batch_estimates(batch_size, np.array([small]), batch_size * micro, np.array([big]))
        sqrs.append(float(sqr[0]))
        vars_.append(float(var[0]))
    sqr, var = float(np.mean(sqrs)), float(np.mean(vars_))
    phi = var / sqr if sqr > 0 else math.inf
    if not phi >= 0:
        phi = 0.0
    return NoiseMeasurement(
        noise_scale=phi,
        sqr=sqr,
        var=max(var, 0.0),
        steps=steps,
        batch_size=batch_size,
        micro=micro,
        seconds=time.perf_counter() - start,
    )


def _checked(model: Any, data: Any, batch_size: int, steps: int, micro: int) -> Any:
    """``data`` as a Dataset, once every input of ``measure_noise_scale`` is one it can measure."""
    import torch

    from distlab.data import as_dataset

    for name, value, least in (("batch_size", batch_size, 1), ("steps", steps, 1), ("micro", micro, 2)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise DistlabError(f"measure_noise_scale: {name} must be an integer >= {least}, got {value!r}")
    if not isinstance(model, torch.nn.Module):
        raise DistlabError(
            f"measure_noise_scale: model must be a torch nn.Module, got {type(model).__name__}"
        )
    dataset = as_dataset(data, "measure_noise_scale: data")
    if dataset is None:
        raise DistlabError(
            "measure_noise_scale: data is required (a Dataset, a DataLoader or (inputs, targets))"
        )
    if len(dataset) < batch_size * micro:
        raise DistlabError(
            f"measure_noise_scale: data has {len(dataset)} samples, fewer than one step's "
            f"{micro} x {batch_size}; lower batch_size or give more data"
        )
    return dataset
