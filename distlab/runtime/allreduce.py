"""All-reduce groups: bucketed gradients reduced asynchronously as they become ready in backward."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distlab.runtime.compress import Compressor
from distlab.runtime.plan import SyncUnit
from distlab.strategy.execution import BUCKET_BYTES, bucket_layout

# small enough to overlap with backward, large enough to amortise alpha; the cost model uses the same
DEFAULT_BUCKET_BYTES = BUCKET_BYTES


def dense_grad(u: SyncUnit) -> torch.Tensor:
    """The unit's slice of its variable's gradient as a dense tensor (zeros if it got none)."""
    p = u.param
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    elif p.grad.is_sparse:  # a dense kernel for a sparse variable: densify locally, once
        p.grad = p.grad.to_dense()
    return u.view(p.grad)


class Bucket:
    """One bucket of an all-reduce group: flattened, pre-divided by the world, reduced in one call.

    A ring all-reduce of n bytes costs 2(p-1)alpha + 2(p-1)/p n beta (Thakur et al. 2005), so
    few large buckets beat many small ones while still leaving room to overlap with backward.
    """

    def __init__(
        self,
        units: list[SyncUnit],
        compressor: Compressor,
        key: int,
        world: int,
        wait: Callable[[Any], None],
    ) -> None:
        self.units, self.compressor, self.key, self.world, self.wait = units, compressor, key, world, wait
        self.params = {id(u.param): u.param for u in units}
        self._work: Any = None
        self._wire: torch.Tensor | None = None
        self._dtype = units[0].param.dtype

    def launch(self) -> None:
        if self.world == 1 and self.compressor.dtype is None:
            self._wire = None  # one rank: every gradient already is the global one, left in place
            return
        if len(self.units) == 1 and self.units[0].axis is None:
            g = dense_grad(self.units[0])
            # one whole variable (a large matrix gets a bucket to itself): reduce its gradient in
            # place instead of copying it into a bucket; cat would cost a pass over its bytes
            flat = g.view(-1) if g.is_contiguous() else g.reshape(-1)
        else:
            flat = torch.cat([dense_grad(u).reshape(-1) for u in self.units])
        flat.div_(self.world)  # pre-divide (as DDP does) so a low-precision wire cannot overflow
        self._wire = self.compressor.encode(self.key, flat)
        if self.world > 1:  # one rank: the bucket is already the sum
            self._work = dist.all_reduce(self._wire, async_op=True)

    def finish(self) -> None:
        if self._work is not None:
            self.wait(self._work)
        if self._wire is None:
            for u in self.units:
                g = dense_grad(u)
                if u.shadow is not None:
                    u.shadow.grad = g
            return
        flat = self.compressor.decode(self._wire, self._dtype)
        offset = 0
        for u in self.units:  # gradients become views of the reduced buffer (no copy back)
            n = u.view(u.param).numel()
            g = flat[offset : offset + n].view(u.view(u.param).shape)
            offset += n
            if u.shadow is not None:
                u.shadow.grad = g
            else:
                u.param.grad = g
        self._work = self._wire = None

    def in_flight(self) -> tuple[Any, Any] | None:
        """The all-reduce launched and not finished (its work handle, its wire tensor); None when
        none is (one rank, or finished)."""
        return (self._work, self._wire) if self._work is not None else None


def build_buckets(
    units: list[SyncUnit],
    world: int,
    error_feedback: bool,
    cap_bytes: int,
    wait: Callable[[Any], None],
) -> list[Bucket]:
    """Buckets of the all-reduce units, in the given (gradient-ready) order, one open bucket per
    (group, compressor, dtype, device), split at ``cap_bytes``: ``strategy.execution.bucket_layout``,
    the layout the cost model prices."""
    keys = [(u.sync.group or 0, u.sync.compressor, u.param.dtype, u.param.device) for u in units]
    sizes = [u.view(u.param).numel() * u.param.element_size() for u in units]
    compressors: dict[str, Compressor] = {}
    buckets: list[Bucket] = []
    for members in bucket_layout(list(zip(keys, sizes, strict=True)), cap_bytes):
        comp = units[members[0]].sync.compressor
        compressor = compressors.setdefault(comp, Compressor(comp, error_feedback))
        buckets.append(Bucket([units[i] for i in members], compressor, len(buckets), world, wait))
    return buckets
