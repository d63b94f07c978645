"""Sparse gradients as (indices, values): take a unit's rows, and move variable-length pieces padded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distlab.runtime.plan import SyncUnit


def sparse_param_ids(model: torch.nn.Module) -> set[int]:
    """Ids of parameters whose gradient is sparse (``nn.Embedding``/``EmbeddingBag`` with ``sparse=True``)."""
    ids = set()
    for m in model.modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            ids.add(id(m.weight))
    return ids


def unit_rows(u: SyncUnit) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's gradient rows for the unit: (row indices within the shard, values), coalesced."""
    g = u.param.grad
    if g is None:
        shape = tuple(u.view(u.param).shape)
        return torch.zeros(0, dtype=torch.long, device=u.param.device), u.param.new_zeros((0, *shape[1:]))
    if not g.is_sparse:
        g = g.to_sparse(1)  # a dense gradient on a sparse kernel: send only its non-zero rows
    g = g.coalesce()
    idx, vals = g.indices()[0], g.values()
    if u.axis == 0:
        keep = (idx >= u.offset) & (idx < u.offset + u.size)
        idx, vals = idx[keep] - u.offset, vals[keep]
    elif u.axis is not None:
        vals = vals.narrow(u.axis, u.offset, u.size)
    return idx, vals


def exchange_sizes(n: int, device: torch.device, wait: Callable[[Any], None]) -> list[int]:
    """Every rank's count, via one tiny all-gather (the pieces that follow are padded to the max)."""
    world = dist.get_world_size()
    mine = torch.tensor([n], dtype=torch.long, device=device)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    wait(dist.all_gather(sizes, mine, async_op=True))
    return [int(s.item()) for s in sizes]


def pad_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    if t.shape[0] == n:
        return t.contiguous()
    out = t.new_zeros((n, *t.shape[1:]))
    out[: t.shape[0]] = t
    return out


def to_sparse_grad(idx: torch.Tensor, vals: torch.Tensor, shape: torch.Size, world: int) -> torch.Tensor:
    """Sum duplicate rows and average over the world: the gradient of the global mean loss."""
    g = torch.sparse_coo_tensor(idx.unsqueeze(0), vals, tuple(shape), check_invariants=False).coalesce()
    return g / world
