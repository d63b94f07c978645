"""Parameter servers on collectives: reduce a variable's (or shard's) gradient to its server, update there, broadcast back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distlab.runtime.allreduce import dense_grad
from distlab.runtime.plan import SyncUnit
from distlab.runtime.sparse import exchange_sizes, pad_rows, to_sparse_grad, unit_rows


class DenseReduce:
    """The gradient half of a dense PS unit: an async ``reduce`` (sum of pre-divided grads) to the server."""

    def __init__(self, u: SyncUnit, world: int, rank: int, wait: Callable[[Any], None]) -> None:
        self.wait = wait
        self.units = [u]
        self.params = {id(u.param): u.param}
        self.u, self.world, self.rank = u, world, rank
        self._buf: torch.Tensor | None = None
        self._work: Any = None

    def launch(self) -> None:
        self._buf = dense_grad(self.u).div(self.world).contiguous()  # a fresh tensor
        self._work = dist.reduce(self._buf, dst=self.u.sync.server, op=dist.ReduceOp.SUM, async_op=True)

    def finish(self) -> None:
        self.wait(self._work)
        if self.rank == self.u.sync.server:
            self.u.target.grad = self._buf.view(self.u.target.shape)
        self._buf = self._work = None


def gather_sparse_to_server(u: SyncUnit, world: int, rank: int, wait: Callable[[Any], None]) -> None:
    """The gradient half of a sparse PS unit: every rank's rows gathered to the server (indices + values)."""
    server = u.sync.server
    idx, vals = unit_rows(u)
    sizes = exchange_sizes(idx.shape[0], idx.device, wait)
    n = max(sizes)
    idx_p, vals_p = pad_rows(idx, n), pad_rows(vals, n)
    if rank == server:
        all_idx = [idx_p.new_empty(idx_p.shape) for _ in range(world)]
        all_vals = [vals_p.new_empty(vals_p.shape) for _ in range(world)]
    else:
        all_idx = all_vals = None
    w1 = dist.gather(idx_p, all_idx, dst=server, async_op=True)
    w2 = dist.gather(vals_p, all_vals, dst=server, async_op=True)
    wait(w1)
    wait(w2)
    if rank == server:
        idx_all = torch.cat([t[:k] for t, k in zip(all_idx, sizes)])
        vals_all = torch.cat([t[:k] for t, k in zip(all_vals, sizes)])
        u.target.grad = to_sparse_grad(idx_all, vals_all, u.target.shape, world)


class ServerBroadcast:
    """The value half: after the server's optimizer step, send the new value (or the changed rows) to all."""

    def __init__(
        self, units: list[SyncUnit], rank: int, sparse_ids: set[int], wait: Callable[[Any], None]
    ) -> None:
        self.units, self.rank, self.wait = units, rank, wait
        self.sparse = [u for u in units if id(u.param) in sparse_ids]
        self.dense = [u for u in units if id(u.param) not in sparse_ids]
        self._before: dict[int, torch.Tensor] = {}
        self._optimizer: Any = None

    def before_step(self, optimizer: Any) -> None:
        """Servers note which rows of their sparse variables the step can change."""
        self._optimizer = optimizer
        self._before = {
            i: _grad_rows(u.target) for i, u in enumerate(self.sparse) if u.sync.server == self.rank
        }

    def after_step(self) -> None:
        works = []
        bufs = []
        for u in self.dense:
            mine = u.sync.server == self.rank
            if u.shadow is None and u.param.is_contiguous():
                buf = u.param.detach()  # received in place
            elif mine:
                buf = u.target.detach().contiguous()
            else:
                buf = torch.empty_like(u.target)
            works.append(dist.broadcast(buf, src=u.sync.server, async_op=True))
            bufs.append((u, buf))
        for w in works:
            self.wait(w)
        with torch.no_grad():
            for u, buf in bufs:
                if buf.data_ptr() != u.param.data_ptr():
                    u.view(u.param).copy_(buf.view(u.view(u.param).shape))
        self._broadcast_rows()
        self._before = {}

    def _changed_rows(self, i: int, u: SyncUnit) -> torch.Tensor:
        """Rows the server's step may have changed: this step's gradient rows plus every row with
        optimizer state (momentum, accumulators). Optimizers that accept sparse gradients (SGD,
        Adagrad, SparseAdam) update row by row, so only those rows can differ."""
        rows = [self._before[i]]
        state = self._optimizer.state.get(u.target, {}) if self._optimizer is not None else {}
        for v in state.values():
            if torch.is_tensor(v) and v.is_sparse:
                rows.append(v.coalesce().indices()[0])
            elif torch.is_tensor(v) and v.shape == u.target.shape:
                rows.append(v.reshape(v.shape[0], -1).ne(0).any(1).nonzero().reshape(-1))
        return torch.cat(rows).unique()

    def _broadcast_rows(self) -> None:
        """Two rounds for all sparse variables at once: the row counts, then rows and values."""
        counts, works = [], []
        changed: dict[int, torch.Tensor] = {}
        for i, u in enumerate(self.sparse):
            c = torch.zeros(1, dtype=torch.long, device=u.target.device)
            if u.sync.server == self.rank:
                changed[i] = self._changed_rows(i, u)
                c[0] = changed[i].numel()
            counts.append(c)
            works.append(dist.broadcast(c, src=u.sync.server, async_op=True))
        for w in works:
            self.wait(w)
        works, moved = [], []
        for i, u in enumerate(self.sparse):
            mine, t, k = u.sync.server == self.rank, u.target.detach(), int(counts[i].item())
            rows = changed[i] if mine else torch.empty(k, dtype=torch.long, device=t.device)
            vals = t.index_select(0, rows) if mine else t.new_empty((k, *t.shape[1:]))
            works += [
                dist.broadcast(rows, src=u.sync.server, async_op=True),
                dist.broadcast(vals, src=u.sync.server, async_op=True),
            ]
            moved.append((u, mine, rows, vals))
        for w in works:
            self.wait(w)
        with torch.no_grad():
            for u, mine, rows, vals in moved:
                if not mine:
                    u.target.index_copy_(0, rows, vals)
                if u.shadow is not None:
                    u.view(u.param).copy_(u.shadow)


def _grad_rows(t: torch.Tensor) -> torch.Tensor:
    g = t.grad
    if g is None:
        return torch.zeros(0, dtype=torch.long, device=t.device)
    if g.is_sparse:
        return g.coalesce().indices()[0]
    return g.reshape(g.shape[0], -1).ne(0).any(1).nonzero().reshape(-1)
