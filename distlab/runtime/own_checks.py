"""What ``ctx.prepare`` refuses of a user's optimizer and loader (``Lab.run``): checked in the kernel
when ``lab.run`` plans (distlab/own_route.py) and again on each rank (runtime/own_session.py)."""

from __future__ import annotations

from typing import Any

import torch

from distlab.errors import LaunchError


def check_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One error for an optimizer over variables the model does not have (the strategy could not
    place them)."""
    own = {id(p) for p in model.parameters()}
    stray = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in own]
    if stray:
        raise LaunchError(
            f"ctx.prepare: the optimizer holds {len(stray)} parameter(s) that are not the model's "
            f"(the first of shape {tuple(stray[0].shape)}); build it on model.parameters()"
        )


def check_loader(loader: Any) -> tuple[bool, Any]:
    """Whether the loader shuffles, and its collate function (None: torch's default, read fast);
    one error for a loader distlab cannot shard."""
    from torch.utils.data import IterableDataset, RandomSampler, SequentialSampler, default_collate

    dataset = getattr(loader, "dataset", None)
    if dataset is None or getattr(loader, "batch_size", None) is None:
        raise LaunchError(
            f"ctx.prepare: loader is a {type(loader).__name__}; pass a torch DataLoader with a batch_size "
            "(distlab shards its dataset per rank)"
        )
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise LaunchError(
            "ctx.prepare: the loader's dataset is iterable; distlab shards a map-style Dataset (len and "
            "[i]) per rank: load it into one (e.g. a list or TensorDataset)"
        )
    sampler = getattr(loader, "sampler", None)
    # shuffle=True or False makes one of these over the whole dataset; one built by hand may
    # cover a subset or draw with replacement, which distlab's sharding would silently ignore
    own_sampler = sampler is not None and (
        type(sampler) not in (RandomSampler, SequentialSampler)
        or getattr(sampler, "data_source", dataset) is not dataset
        or getattr(sampler, "replacement", False)
        or getattr(sampler, "_num_samples", None) is not None
    )
    if own_sampler:
        raise LaunchError(
            f"ctx.prepare: the loader has its own sampler ({type(sampler).__name__}); distlab shards the "
            "dataset per rank in its own order: build the DataLoader with shuffle=True or False, no sampler= "
            "(for part of the data: DataLoader(torch.utils.data.Subset(dataset, indices), ...))"
        )
    collate = getattr(loader, "collate_fn", None) or default_collate
    tensors = getattr(dataset, "tensors", None)
    pairs = (tensors is not None and len(tensors) == 2) or type(dataset).__name__ == "TensorPairs"
    if pairs and getattr(collate, "__name__", "") == "default_collate":
        collate = None  # (input, target) tensors: indexed at once, not sample by sample
    return isinstance(sampler, RandomSampler), collate
