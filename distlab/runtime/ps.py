"""Parameter servers on collectives: reduce a variable's (or shard's) gradient to its server, update there,
broadcast back."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from distlab.runtime.allreduce import dense_grad
from distlab.runtime.plan import SyncUnit
from distlab.runtime.sparse import Packed, by_dtype, rows_and_counts, to_sparse_grad


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
        g = dense_grad(self.u)
        # a fresh tensor (the reduce writes into it); one rank's gradient is the global one as it is
        self._buf = (
            g.div(self.world).contiguous() if self.world > 1 else (g if g.is_contiguous() else g.contiguous())
        )
        if self.world > 1:  # one rank: its gradient is the sum
            self._work = dist.reduce(self._buf, dst=self.u.sync.server, op=dist.ReduceOp.SUM, async_op=True)

    def finish(self) -> None:
        if self._work is not None:
            self.wait(self._work)
        if self.rank == self.u.sync.server:
            self.u.target.grad = self._buf.view(self.u.target.shape)
        self._buf = self._work = None

    def in_flight(self) -> tuple[Any, Any] | None:
        """The reduce launched and not finished (its work handle, its tensor); None when none is."""
        return (self._work, self._buf) if self._work is not None else None


def gather_sparse_to_servers(
    units: Sequence[SyncUnit], world: int, rank: int, wait: Callable[[Any], None]
) -> None:
    """The gradient half of sparse PS units: every rank's rows gathered to each unit's server.

    One all-gather of the row counts for all units, then per server (and value dtype) one
    gather of the indices and one of the values of all the units it serves, all in flight
    together. One rank moves nothing.
    """
    units = list(units)
    if not units:
        return
    rows, counts = rows_and_counts(units, world, wait)
    if counts is None:
        return
    works = []
    for (server, _), members in by_dtype(units, rows, lambda u: u.sync.server).items():
        packed = Packed([rows[i] for i in members], counts[:, members])
        all_idx, all_vals = packed.buffers() if rank == server else (None, None)
        works.append(
            (
                server,
                members,
                packed,
                all_idx,
                all_vals,
                dist.gather(packed.idx, all_idx, dst=server, async_op=True),
                dist.gather(packed.vals, all_vals, dst=server, async_op=True),
            )
        )
    for server, members, packed, all_idx, all_vals, w1, w2 in works:
        wait(w1)
        wait(w2)
        if rank == server:
            for i, (idx, vals) in zip(members, packed.unpack(all_idx, all_vals)):
                units[i].target.grad = to_sparse_grad(idx, vals, units[i].target.shape, world)


class ServerBroadcast:
    """The value half: after the server's optimizer step, send the new value (or the changed rows) to all."""

    def __init__(
        self,
        units: list[SyncUnit],
        rank: int,
        sparse_ids: set[int],
        wait: Callable[[Any], None],
        packed: bool = True,
    ) -> None:
        """``packed``: a server's sparse variables share one broadcast of counts, rows and values;
        False sends each variable's on its own."""
        self.units, self.rank, self.wait, self.packed = units, rank, wait, packed
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
            if dist.get_world_size() > 1:  # one rank is every server: the value is already here
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
        """Per server (and dtype), all its sparse variables at once: the changed-row counts, then
        the rows and their values packed (three broadcasts per server, not three per variable)."""
        if not self.sparse:
            return
        groups: dict[tuple, list[int]] = {}
        for i, u in enumerate(self.sparse):
            groups.setdefault((u.sync.server, u.target.dtype, None if self.packed else i), []).append(i)
        changed = {
            i: self._changed_rows(i, u) for i, u in enumerate(self.sparse) if u.sync.server == self.rank
        }
        moved = []
        if dist.get_world_size() > 1:  # one rank serves everything: nothing to send
            counts, works = {}, []
            for key, members in groups.items():
                mine, device = key[0] == self.rank, self.sparse[members[0]].target.device
                c = torch.tensor(
                    [changed[i].numel() if mine else 0 for i in members], dtype=torch.long, device=device
                )
                counts[key] = c
                works.append(dist.broadcast(c, src=key[0], async_op=True))
            for w in works:
                self.wait(w)
            works = []
            for key, members in groups.items():
                mine, n = key[0] == self.rank, counts[key].cpu().tolist()
                targets = [self.sparse[i].target.detach() for i in members]
                widths = [math.prod(t.shape[1:]) for t in targets]
                if mine:
                    rows = torch.cat([changed[i] for i in members])
                    vals = torch.cat(
                        [t.index_select(0, changed[i]).reshape(-1) for i, t in zip(members, targets)]
                    )
                else:
                    rows = torch.empty(sum(n), dtype=torch.long, device=targets[0].device)
                    vals = targets[0].new_empty(sum(k * w for k, w in zip(n, widths)))
                works += [
                    dist.broadcast(rows, src=key[0], async_op=True),
                    dist.broadcast(vals, src=key[0], async_op=True),
                ]
                if not mine:
                    moved.append((members, n, widths, rows, vals))
            for w in works:
                self.wait(w)
        with torch.no_grad():
            rows_of = dict(changed)  # unit -> the rows that changed this step
            for members, n, widths, rows, vals in moved:
                parts = vals.split([k * w for k, w in zip(n, widths)])
                for i, r, v in zip(members, rows.split(n), parts):
                    t = self.sparse[i].target
                    t.index_copy_(0, r, v.view(r.numel(), *t.shape[1:]))
                    rows_of[i] = r
            for i, u in enumerate(self.sparse):
                if u.shadow is not None:  # a shard: only its changed rows differ from the variable
                    r = rows_of[i]
                    u.view(u.param).index_copy_(0, r, u.shadow.detach().index_select(0, r))


def _grad_rows(t: torch.Tensor) -> torch.Tensor:
    g = t.grad
    if g is None:
        return torch.zeros(0, dtype=torch.long, device=t.device)
    if g.is_sparse:
        return g.coalesce().indices()[0]
    return g.reshape(g.shape[0], -1).ne(0).any(1).nonzero().reshape(-1)
