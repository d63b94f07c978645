"""The per-rank synchroniser: composes the kernels for every unit of a strategy around backward and the
optimizer step."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from distlab.runtime.allgather import allgather_sparse
from distlab.runtime.allreduce import DEFAULT_BUCKET_BYTES, build_buckets
from distlab.runtime.async_gossip import AsyncGossip
from distlab.runtime.gossip import Gossip
from distlab.runtime.plan import SyncUnit
from distlab.runtime.process_group import block, on_run_device
from distlab.runtime.ps import DenseReduce, ServerBroadcast, gather_sparse_to_servers
from distlab.runtime.sparse import sparse_param_ids
from distlab.runtime.stale_ps import StalePS, stale_units
from distlab.runtime.trace import OFF
from distlab.strategy.types import ASYNC_GOSSIP_MODES


class Synchronizer:
    """Partition -> replicate -> synchronise, per unit (AutoDist's kernels, for torch).

    Dense gradient work (all-reduce buckets, PS reduces) is launched from gradient hooks in a
    fixed order as soon as every gradient it needs is ready, so it overlaps with the rest of
    backward; sparse exchanges need their sizes first and run after backward; the optimizer
    step runs on replicated units everywhere and on PS units only on their server.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        units: list[SyncUnit],
        make_optimizer: Callable[[list], Any],
        rank: int,
        world: int,
        topology: Any = None,
        gossip_mode: str = "atc",
        error_feedback: bool = False,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        wait: Callable[[Any], None] = block,
        packed: bool = True,
        noise: Any = None,
        tracer: Any = OFF,
        timeout: float = 300.0,
    ) -> None:
        """``packed``: every sparse table in one exchange (runtime/sparse.py); False runs one per table.
        ``noise``: a ``runtime.noise.GradNoise`` that sees each local gradient before the sync and
        the averaged ones after it. ``tracer``: a ``runtime.trace.Tracer`` the sync's spans go to.
        ``timeout``: the longest a stale or asynchronous PS waits for a peer (runtime/stale_ps.py)."""
        self.wait, self.packed, self.noise, self.tracer = wait, packed, noise, tracer
        self.model, self.units, self.rank, self.world = model, units, rank, world
        sparse = sparse_param_ids(model)
        order = {id(p): i for i, p in enumerate(model.parameters())}
        # gradients arrive roughly in reverse model order: launch work in that order
        rev = sorted(units, key=lambda u: (-order[id(u.param)], u.shard or 0))
        stale = stale_units(units)  # stale-synchronous or asynchronous PS: runtime/stale_ps.py
        rev = [u for u in rev if u not in stale]
        ar = [
            u
            for u in rev
            if u.sync.kind == "allreduce" or (u.sync.kind == "allgather" and id(u.param) not in sparse)
        ]
        ps_dense = [u for u in rev if u.sync.kind == "ps" and id(u.param) not in sparse]
        self.sparse_units = [u for u in rev if u.sync.kind in ("allgather", "ps") and id(u.param) in sparse]
        self.ps_units = [u for u in units if u.sync.kind == "ps" and u not in stale]
        gossip_units = [u for u in units if u.sync.kind == "gossip"]
        tasks = build_buckets(ar, world, error_feedback, bucket_bytes, wait) + [
            DenseReduce(u, world, rank, wait) for u in ps_dense
        ]
        first_ready = {id(t): min(order[i] for i in t.params) for t in tasks}
        self.tasks = sorted(tasks, key=lambda t: -first_ready[id(t)])
        self._tasks_of: dict[int, list] = {}
        for t in self.tasks:
            for pid in t.params:
                self._tasks_of.setdefault(pid, []).append(t)
        self._pending: dict[int, int] = {}
        self._next = 0
        self._hooks = []
        self.last_ready = 0.0
        self._labels: dict[int, list[tuple[str, int]]] = {}  # a variable's units, for the trace
        for u in units:
            self._labels.setdefault(id(u.param), []).append((u.label, _nbytes(u.view(u.param))))
        for p in {id(u.param): u.param for u in units}.values():
            self._hooks.append(p.register_post_accumulate_grad_hook(self._on_ready))
        local = [u.target for u in units if u.sync.kind != "ps"]
        served = [u.target for u in self.ps_units if u.sync.server == rank]
        self.local_opt = make_optimizer(local) if local else None
        self.server_opt = make_optimizer(served) if served else None
        self.broadcast = ServerBroadcast(self.ps_units, rank, sparse, wait, packed)
        self.gossip: Any = None
        if gossip_units and gossip_mode in ASYNC_GOSSIP_MODES:  # BlueFog's windows: no barrier per step
            self.gossip = AsyncGossip(
                [u.target for u in gossip_units], topology, gossip_mode, rank, world, timeout
            )
        elif gossip_units:
            self.gossip = Gossip([u.target for u in gossip_units], topology, gossip_mode, rank, world, wait)
        self.stale = StalePS(stale, make_optimizer, rank, world, timeout, sparse, tracer) if stale else None
        self.comm_time = 0.0
        self._syncing = True  # False during the micro-batches before the last one of a step

    # -- backward ----------------------------------------------------------------------
    def zero_grad(self) -> None:
        self.clear_grads()
        self.new_step()

    def clear_grads(self) -> None:
        for p in self.model.parameters():
            p.grad = None
        for u in self.units:
            if u.shadow is not None:
                u.shadow.grad = None

    def new_step(self) -> None:
        """A step begins: every gradient task waits for its gradients again."""
        self._pending = {id(t): len(t.params) for t in self.tasks}
        self._next = 0
        self.comm_time = 0.0
        if self.noise is not None:
            self.noise.begin_step()

    @property
    def launched(self) -> int:
        """Gradient tasks (buckets, PS reduces) launched so far in this step."""
        return self._next

    @contextmanager
    def micro(self, last: bool) -> Iterator[None]:
        """One micro-batch's forward and backward: gradients accumulate locally, and only the
        last micro-batch of a step launches the gradient work (every sync kind syncs once)."""
        self._syncing = last
        try:
            yield
        finally:
            self._syncing = True

    def set_syncing(self, on: bool) -> None:
        """An own loop's micro-steps (``ctx.accumulate``): False while gradients only accumulate."""
        self._syncing = on

    def _on_ready(self, p: torch.Tensor) -> None:
        if not self._syncing:
            return
        self.last_ready = time.perf_counter()
        if self.tracer.enabled:
            for label, nbytes in self._labels.get(id(p), ()):
                self.tracer.ready(label, nbytes)
        if self.noise is not None:  # its local norm, before a bucket averages it in place
            self.noise.on_local_grad(p)
        for t in self._tasks_of.get(id(p), ()):
            self._pending[id(t)] -= 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next < len(self.tasks):
            t = self.tasks[self._next]
            if not force and self._pending.get(id(t), 0) > 0:
                return
            t.launch()
            self._next += 1
            if self.tracer.enabled:
                self._trace_task(t)

    def _trace_task(self, t: Any) -> None:
        """The span of a gradient task just launched: a bucket's all-reduce or a PS reduce to its server."""
        flight = t.in_flight()
        if flight is None:
            return
        work, buf = flight
        if isinstance(t, DenseReduce):
            server = t.u.sync.server
            self.tracer.collective(
                work, f"PS push {t.u.label} to rank {server}", "ps", bytes=_nbytes(buf), peers=[server]
            )
        else:
            names = [u.label for u in t.units]
            self.tracer.collective(
                work,
                f"all-reduce bucket {t.key}",
                "allreduce",
                bytes=_nbytes(buf),
                peers=[r for r in range(self.world) if r != self.rank],
                variables=names[:8],
            )

    def begin(self, step: int) -> None:
        """Before forward: AWC gossip sends the current parameters now, hidden behind forward and backward."""
        if self.gossip is not None:
            self.gossip.before_step(step)

    # -- after backward ----------------------------------------------------------------
    def step(self, step: int) -> None:
        """Finish gradient sync, apply the optimizers, and synchronise parameters."""
        self.sync_grads()
        self.apply(step)

    def sync_grads(self) -> None:
        """Finish the step's gradient communication: every all-reduced gradient averaged in place,
        every PS gradient on its server (what ``apply`` steps on)."""
        t0 = time.perf_counter()
        tr, others = self.tracer, [r for r in range(self.world) if r != self.rank]
        with tr.span("waiting for gradient communication", "wait"):
            self._launch_ready(force=True)  # variables that got no gradient this step
            for t in self.tasks:
                t.finish()
        gathered = [u for u in self.sparse_units if u.sync.kind == "allgather"]
        served = [u for u in self.sparse_units if u.sync.kind == "ps"]
        for group in [gathered] if self.packed and gathered else [[u] for u in gathered]:
            with tr.span(
                "sparse all-gather", "allgather", variables=[u.label for u in group][:8], peers=others
            ):
                allgather_sparse(group, self.wait)
        for group in [served] if self.packed and served else [[u] for u in served]:
            with tr.span("PS push (sparse rows to servers)", "ps", variables=[u.label for u in group][:8]):
                gather_sparse_to_servers(group, self.world, self.rank, self.wait)
        if self.noise is not None:
            self.noise.after_sync()
        self.comm_time = time.perf_counter() - t0

    def apply(self, step: int) -> None:
        """The optimizers' step on the synchronised gradients, then the parameters' sync (PS
        broadcasts, gossip, a stale PS's pushes and pulls)."""
        tr = self.tracer
        comm = self.comm_time
        with tr.span("optimizer", "optimizer"):
            self.broadcast.before_step(self.server_opt)
            if self.local_opt is not None:
                self.local_opt.step()
            if self.server_opt is not None:
                self.server_opt.step()
        t1 = time.perf_counter()
        if self.ps_units:
            with tr.span(
                "PS pull (servers broadcast new values)",
                "ps",
                servers=sorted({u.sync.server for u in self.ps_units}),
                bytes=sum(_nbytes(u.target) for u in self.ps_units),
            ):
                self.broadcast.after_step()
        if self.gossip is not None:
            with tr.span(
                "gossip exchange",
                "gossip",
                bytes=sum(_nbytes(t) for t in self.gossip.tensors),
                peers=self.gossip.in_neighbours(step),
            ):
                self.gossip.after_step(step)
        comm += time.perf_counter() - t1
        if self.stale is not None:  # pushes to the servers, then the values the staleness allows
            self.stale.step()
            comm += self.stale.waited
        with torch.no_grad():
            for u in self.units:  # replicated shards: write the stepped shard back into the variable
                if u.shadow is not None and u.sync.kind != "ps":
                    u.view(u.param).copy_(u.shadow)
        self.comm_time = comm

    def refresh_shadows(self) -> None:
        """Reload every shard's own parameter from the variable (after a checkpoint restore), and
        a stale PS server's values."""
        with torch.no_grad():
            for u in self.units:
                if u.shadow is not None:
                    u.shadow.copy_(u.view(u.param))
        if self.stale is not None and self.stale.server is not None:
            self.stale.server.reload()
        if isinstance(self.gossip, AsyncGossip):
            self.gossip.reload()

    def settle(self, step: int = 0, samples: int = 0) -> tuple[int, int]:
        """A checkpoint's consistent cut and the (step, samples) every rank checkpoints at: a stale
        PS's every push applied and every rank's variables equal (StalePS.settle); asynchronous
        gossip's every message landed (its replicas still differ: the checkpoint keeps rank 0's
        and a resume starts every rank from them); nothing to do for the synchronous kernels,
        whose step ends in agreement."""
        if isinstance(self.gossip, AsyncGossip):
            self.gossip.settle()
            if self.stale is None:
                return _furthest(step, samples)
        return self.stale.settle(step, samples) if self.stale is not None else (step, samples)

    def finish(self, rendezvous: Callable[[], None] | None = None) -> None:
        """After the last step: a stale PS's final values on every rank; asynchronous gossip's
        last messages taken in once every neighbour has finished. ``rendezvous`` (an asynchronous
        run's end, with no collective) comes before the run's last collectives."""
        if self.stale is not None:
            self.stale.finish(rendezvous)  # before the servers' final broadcast
        elif isinstance(self.gossip, AsyncGossip):
            self.gossip.finish()
            if rendezvous is not None:  # before the consensus distance's all-reduce
                rendezvous()

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.noise is not None:
            self.noise.close()
        if self.stale is not None:
            self.stale.close()
        if isinstance(self.gossip, AsyncGossip):
            self.gossip.close()


def _furthest(step: int, samples: int) -> tuple[int, int]:
    """The furthest rank's (step, samples) (collective): asynchronous ranks stopped by a cancel
    stand at different steps, and a resume goes on after the furthest."""
    import torch.distributed as dist

    agreed = on_run_device(torch.tensor([step, samples], dtype=torch.long))
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return int(agreed[0]), int(agreed[1])


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if t is not None else 0
