"""The fast path for a pure all-reduce strategy: torch's DistributedDataParallel reducer (C++ buckets,
overlap)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from distlab.runtime.plan import SyncUnit
from distlab.runtime.trace import OFF


class DDPSynchronizer:
    """Same interface as ``Synchronizer``; groups are DDP's size-capped buckets, not the strategy's ids."""

    gossip = None
    server_opt = None

    def __init__(
        self,
        model: torch.nn.Module,
        units: list[SyncUnit],
        make_optimizer: Callable[[list], Any],
        device: str,
        tracer: Any = OFF,
    ) -> None:
        """``tracer``: a ``runtime.trace.Tracer``; when on, each of DDP's buckets is traced from its
        launch to its completion through a comm hook around the bucket's usual one (a Python hook
        in place of DDP's built-in C++ all-reduce)."""
        self.model, self.units, self.tracer = model, units, tracer
        ids = [torch.device(device).index or 0] if device.startswith("cuda") else None
        self.wrapped = DistributedDataParallel(model, device_ids=ids, gradient_as_bucket_view=True)
        comp = units[0].sync.compressor
        hook = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}.get(comp)
        if tracer.enabled:
            hook = _traced(hook or default_hooks.allreduce_hook, tracer)
        if hook is not None:
            self.wrapped.register_comm_hook(None, hook)
        self.local_opt = make_optimizer([u.param for u in units])
        self.last_ready = 0.0
        self.comm_time = 0.0
        self._labels = {id(u.param): u.label for u in units}
        self._hooks = [u.param.register_post_accumulate_grad_hook(self._on_ready) for u in units]

    def _on_ready(self, p: torch.Tensor) -> None:
        self.last_ready = time.perf_counter()
        if self.tracer.enabled:
            self.tracer.ready(self._labels[id(p)], int(p.numel() * p.element_size()))

    def zero_grad(self) -> None:
        self.clear_grads()
        self.new_step()

    def clear_grads(self) -> None:
        self.local_opt.zero_grad(set_to_none=True)

    def new_step(self) -> None:
        self.comm_time = 0.0

    @contextmanager
    def micro(self, last: bool) -> Iterator[None]:
        """A micro-batch before the last one of a step runs under DDP's ``no_sync``: its gradients
        accumulate locally and the reducer all-reduces once, in the last micro-batch's backward."""
        with nullcontext() if last else self.wrapped.no_sync():
            yield

    def begin(self, step: int) -> None:
        pass

    def set_syncing(self, on: bool) -> None:
        """An own loop's micro-steps: what ``no_sync`` sets, for a backward the loop calls itself."""
        self.wrapped.require_backward_grad_sync = on

    def step(self, step: int) -> None:
        self.apply(step)

    def sync_grads(self) -> None:
        """Nothing left: DDP's reducer averaged every gradient during backward."""

    def apply(self, step: int) -> None:
        with self.tracer.span("optimizer", "optimizer"):
            self.local_opt.step()

    def refresh_shadows(self) -> None:
        pass

    stale = None  # no stale PS: DDP runs all-reduce strategies only

    def settle(self, step: int = 0, samples: int = 0) -> tuple[int, int]:
        """Nothing to settle: DDP's step ends with every replica equal."""
        return step, samples

    def finish(self) -> None:
        """Nothing to finish after the last step."""

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        # the C++ reducer holds the process group; drop it now so a failed run's sockets close
        # (and peers blocked on this rank fail at once) even while its traceback is kept
        self.wrapped.reducer = None
        self.wrapped.logger = None


def _traced(hook: Callable[[Any, Any], Any], tracer: Any) -> Callable[[Any, Any], Any]:
    """``hook`` with each bucket's span on the tracer's comm track."""
    import torch.distributed as dist

    def traced(state, bucket):  # noqa: ANN001, ANN202 - DDP refuses a hook whose bucket is annotated otherwise than GradBucket
        fut = hook(state, bucket)
        buf = bucket.buffer()
        world, rank = dist.get_world_size(), dist.get_rank()
        tracer.collective(
            _Done(fut),
            f"all-reduce bucket {bucket.index()}",
            "allreduce",
            bytes=int(buf.numel() * buf.element_size()),
            peers=[r for r in range(world) if r != rank],
        )
        return fut

    return traced


class _Done:
    """A future as the tracer's work handle."""

    def __init__(self, fut: Any) -> None:
        self._fut = fut

    def get_future(self) -> Any:
        return self._fut
