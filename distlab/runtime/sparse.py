"""Sparse gradients as (indices, values): take a unit's rows, and move many units' rows in one exchange.

Every exchange packs the rows of all its units into two flat tensors (indices, values), padded
to the largest rank's total, so a step costs three collective calls (counts, indices, values)
however many embedding tables the model has, instead of three per table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from distlab.runtime.plan import SyncUnit

Rows = tuple[torch.Tensor, torch.Tensor]  # (row indices within the unit, values)


def sparse_param_ids(model: torch.nn.Module) -> set[int]:
    """Ids of parameters whose gradient is sparse (``nn.Embedding``/``EmbeddingBag`` with ``sparse=True``)."""
    ids = set()
    for m in model.modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            ids.add(id(m.weight))
    return ids


def unit_rows(u: SyncUnit, coalesced: dict[int, Any] | None = None) -> Rows:
    """This rank's gradient rows for the unit: (row indices within the shard, values), coalesced.

    ``coalesced``: a dict shared by the units of one step, so a variable split into shards is
    coalesced once, not once per shard.
    """
    g = u.param.grad
    if g is None:
        shape = tuple(u.view(u.param).shape)
        return torch.zeros(0, dtype=torch.long, device=u.param.device), u.param.new_zeros((0, *shape[1:]))
    key = id(u.param)
    if coalesced is not None and key in coalesced:
        idx, vals = coalesced[key]
    else:
        if not g.is_sparse:
            g = g.to_sparse(1)  # a dense gradient on a sparse kernel: send only its non-zero rows
        g = g.coalesce()
        idx, vals = g.indices()[0], g.values()
        if coalesced is not None:
            coalesced[key] = (idx, vals)
    if u.axis == 0:
        keep = (idx >= u.offset) & (idx < u.offset + u.size)
        idx, vals = idx[keep] - u.offset, vals[keep]
    elif u.axis is not None:
        vals = vals.narrow(u.axis, u.offset, u.size)
    return idx, vals


def units_rows(units: Sequence[SyncUnit]) -> list[Rows]:
    """``unit_rows`` of every unit, each variable coalesced once."""
    coalesced: dict[int, Any] = {}
    return [unit_rows(u, coalesced) for u in units]


def own_sparse_grad(idx: torch.Tensor, vals: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """One rank's rows as its gradient: already coalesced (sorted, unique), so not coalesced again."""
    return torch.sparse_coo_tensor(
        idx.unsqueeze(0), vals, tuple(shape), check_invariants=False, is_coalesced=True
    )


def rows_and_counts(
    units: Sequence[SyncUnit], world: int, wait: Callable[[Any], None]
) -> tuple[list[Rows], torch.Tensor | None]:
    """Each unit's rows and every rank's counts of them (one all-gather for all units).

    One rank has nothing to exchange: its rows become its gradients here and counts is None.
    """
    rows = units_rows(units)
    if world == 1:
        for u, (idx, vals) in zip(units, rows):
            u.target.grad = own_sparse_grad(idx, vals, u.target.shape)
        return rows, None
    return rows, exchange_counts([idx.shape[0] for idx, _ in rows], rows[0][0].device, wait)


def exchange_counts(counts: Sequence[int], device: torch.device, wait: Callable[[Any], None]) -> torch.Tensor:
    """Every rank's row count per unit, ``(world, units)``, via one tiny all-gather."""
    world = dist.get_world_size()
    mine = torch.tensor(list(counts), dtype=torch.long, device=device)
    out = [torch.empty_like(mine) for _ in range(world)]
    wait(dist.all_gather(out, mine, async_op=True))
    return torch.stack(out).cpu()


def by_dtype(
    units: Sequence[SyncUnit], rows: Sequence[Rows], extra: Callable[[SyncUnit], Any] = lambda u: None
):
    """Positions of the units grouped by (``extra(u)``, value dtype): one exchange each."""
    groups: dict[Any, list[int]] = {}
    for i, (u, (_, vals)) in enumerate(zip(units, rows)):
        groups.setdefault((extra(u), vals.dtype), []).append(i)
    return groups


class Packed:
    """The rows of several units as two flat tensors padded for an exchange whose counts are known."""

    def __init__(self, rows: Sequence[Rows], counts: torch.Tensor) -> None:
        """``counts``: ``(world, units)`` row counts of these units on every rank."""
        self.row_shapes = [tuple(vals.shape[1:]) for _, vals in rows]
        self.widths = torch.tensor([math.prod(s) for s in self.row_shapes], dtype=torch.long)
        self.counts = counts
        self.n_idx = int(counts.sum(1).max())
        self.n_val = int((counts * self.widths).sum(1).max())
        idx = torch.cat([i for i, _ in rows]) if rows else torch.zeros(0, dtype=torch.long)
        vals = torch.cat([v.reshape(-1) for _, v in rows])
        self.idx, self.vals = _pad(idx, self.n_idx), _pad(vals, self.n_val)

    def buffers(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        world = self.counts.shape[0]
        return [torch.empty_like(self.idx) for _ in range(world)], [
            torch.empty_like(self.vals) for _ in range(world)
        ]

    def unpack(self, all_idx: Sequence[torch.Tensor], all_vals: Sequence[torch.Tensor]) -> list[Rows]:
        """Per unit: every rank's rows, concatenated (rank order)."""
        per_unit: list[tuple[list, list]] = [([], []) for _ in self.row_shapes]
        for r, (idx, vals) in enumerate(zip(all_idx, all_vals)):
            n = self.counts[r].tolist()
            m = (self.counts[r] * self.widths).tolist()
            for k, (i, v) in enumerate(zip(idx[: sum(n)].split(n), vals[: sum(m)].split(m))):
                per_unit[k][0].append(i)
                per_unit[k][1].append(v.view(n[k], *self.row_shapes[k]))
        return [(torch.cat(i), torch.cat(v)) for i, v in per_unit]


def _pad(t: torch.Tensor, n: int) -> torch.Tensor:
    if t.shape[0] == n:
        return t.contiguous()
    out = t.new_zeros((n, *t.shape[1:]))
    out[: t.shape[0]] = t
    return out


def to_sparse_grad(idx: torch.Tensor, vals: torch.Tensor, shape: torch.Size, world: int) -> torch.Tensor:
    """Sum duplicate rows and average over the world: the gradient of the global mean loss."""
    g = torch.sparse_coo_tensor(idx.unsqueeze(0), vals, tuple(shape), check_invariants=False).coalesce()
    return g / world


def sparse_names(model: torch.nn.Module, units: Any) -> set[str]:
    """Names of the variables (of ``units``) whose gradients are sparse."""
    ids = sparse_param_ids(model)
    return {u.name for u in units if id(u.param) in ids}
