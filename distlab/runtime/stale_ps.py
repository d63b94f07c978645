"""Stale-synchronous and asynchronous parameter servers (AutoDist's ``sync``/``staleness``), on
point-to-point messages over two gloo groups of their own.

Each server rank owns the authoritative copy of the PS variables it serves and their optimizer,
and runs a receiver thread per other worker that takes that worker's pushes. A worker, after its
backward, pushes its gradient (divided by the world, so a round of pushes moves the variables as
one synchronous step of the mean would) to every server; the server applies it at once
(AutoDist's ``take_grad(1)``) and answers with the new values when the worker may go on:

- ``staleness`` s (SSP, Ho et al. 2013): the answer to a worker entering clock c waits until
  every worker has pushed clocks 0..c-s-1, so it sees every update from those clocks and runs at
  most s clocks ahead of the slowest (AutoDist's token queues of capacity s);
- asynchronous (``sync=False``): the answer leaves at once. With ``local_replication`` the
  worker does not wait for it either: it reads its proxy copy, refreshed when an answer lands.

Each push carries its clock and a server applies a worker's clock once (a resent or replayed
push is dropped), so no gradient is applied twice. Every worker posts its answers' receives
before it pushes, and servers answer with sends of snapshots (never a tensor being stepped), so
a send finds its receive posted and neither side can wait on the other in a cycle.
``staleness=0`` with ``sync=True`` never comes here: it is the synchronous PS of runtime/ps.py,
bit for bit.

Long because the worker's side, the servers' receiver threads and their ending (finish, settle,
close) share one protocol (the message layout, the clocks, the gate) that reads best in one place.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distlab.errors import LaunchError
from distlab.runtime.allreduce import dense_grad
from distlab.runtime.plan import SyncUnit
from distlab.runtime.process_group import on_run_device
from distlab.runtime.trace import OFF

PUSH, DONE = 1, 2


def _arrived(head: torch.Tensor) -> bool:
    """An answer's clocks landed (a gloo receive reports nothing until waited on; the servers'
    clocks are never both 0 in an answer, since a push came first)."""
    return bool(head.any())


def stale_units(units: list[SyncUnit]) -> list[SyncUnit]:
    """The PS units a strategy runs stale-synchronously or asynchronously (none for synchronous PS)."""
    return [u for u in units if u.sync.kind == "ps" and u.sync.consistency != (True, 0)]


class _Layout:
    """One server's units, flattened in a fixed order into one buffer of one dtype; ``sparse``:
    which of them the optimizer steps with sparse (row) gradients, as the model makes them."""

    def __init__(self, units: list[SyncUnit], sparse_ids: set[int]) -> None:
        self.units = units
        self.sparse = [id(u.param) in sparse_ids for u in units]
        self.sizes = [u.view(u.param).numel() for u in units]
        dtype = units[0].param.dtype
        for u in units[1:]:
            dtype = torch.promote_types(dtype, u.param.dtype)
        self.dtype, self.numel = dtype, sum(self.sizes)

    def pieces(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [
            p.view(u.view(u.param).shape).to(u.param.dtype)
            for u, p in zip(self.units, flat.split(self.sizes))
        ]


class _Server:
    """The authoritative values of one rank's PS variables, their optimizer and every worker's clock.

    Driven by its receiver threads (pushes from other ranks) and by its own rank's worker (in
    process), one at a time under ``cond``.
    """

    def __init__(self, layout: _Layout, make_optimizer: Callable[[list], Any], world: int, gate: int | None):
        """``gate``: the staleness bound s, or None for no gate (asynchronous)."""
        self.layout, self.world, self.gate = layout, world, gate
        self.values = [
            torch.nn.Parameter(u.view(u.param).detach().clone().cpu(), requires_grad=True)
            for u in layout.units
        ]
        self.optimizer = make_optimizer(self.values)
        self.clocks = [0] * world  # pushes applied, per worker
        self.done = [False] * world
        self.cond = threading.Condition()
        self.error: BaseException | None = None

    def reload(self) -> None:
        """The values from the workers' variables (after a checkpoint was loaded into them)."""
        with self.cond, torch.no_grad():
            for v, u in zip(self.values, self.layout.units):
                v.copy_(u.view(u.param).detach().cpu())

    def apply(self, worker: int, clock: int, flat: torch.Tensor) -> bool:
        """Step the optimizer with one worker's gradient of ``clock``; False for a clock already applied."""
        with self.cond:
            if clock < self.clocks[worker]:
                return False  # resent: applied once already
            if clock != self.clocks[worker]:
                raise LaunchError(
                    f"PS server: rank {worker} pushed clock {clock} after {self.clocks[worker] - 1}; a "
                    "push was lost"
                )
            for v, g, sparse in zip(self.values, self.layout.pieces(flat), self.layout.sparse):
                v.grad = g.to_sparse(sparse_dim=1) if sparse else g
            self.optimizer.step()
            for v in self.values:
                v.grad = None
            self.clocks[worker] = clock + 1
            self.cond.notify_all()
            return True

    def finish(self, worker: int) -> None:
        with self.cond:
            self.done[worker] = True
            self.cond.notify_all()

    def ready(self, clock: int) -> bool:
        """A worker entering ``clock`` may have its values: every other worker pushed clocks
        0..clock-s-1 (or is done), or there is no gate."""
        if self.gate is None:
            return True
        need = clock - self.gate
        return all(c >= need or d for c, d in zip(self.clocks, self.done))

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat values, [slowest clock, fastest clock]): a copy, never a tensor being stepped."""
        with self.cond:
            flat = torch.cat([v.detach().reshape(-1).to(self.layout.dtype) for v in self.values])
            live = [c for c, d in zip(self.clocks, self.done) if not d] or self.clocks
            return flat, torch.tensor([min(live), max(self.clocks)], dtype=torch.long)


class StalePS:
    """One rank's side of the stale or asynchronous PS units: its worker's pushes and reads, and
    (on a server rank) the receiver threads answering every other worker's pushes."""

    def __init__(
        self,
        units: list[SyncUnit],
        make_optimizer: Callable[[list], Any],
        rank: int,
        world: int,
        timeout: float,
        sparse_ids: set[int],
        tracer: Any = OFF,
    ) -> None:
        """``sparse_ids``: ids of the variables whose gradients are sparse (their rows are pushed
        dense and stepped as sparse gradients on the server)."""
        self.units, self.rank, self.world, self.timeout, self.tracer = units, rank, world, timeout, tracer
        sync, staleness = units[0].sync.consistency
        self.gate = staleness if sync else None
        self.proxy = not sync and any(u.sync.local_replication for u in units)
        by_server: dict[int, list[SyncUnit]] = {}
        for u in units:
            by_server.setdefault(u.sync.server, []).append(u)
        self.layouts = {s: _Layout(us, sparse_ids) for s, us in sorted(by_server.items())}
        td = datetime.timedelta(seconds=timeout)
        # every rank makes both groups, in this order (new_group is collective)
        self.push_group = dist.new_group(backend="gloo", timeout=td) if world > 1 else None
        self.reply_group = dist.new_group(backend="gloo", timeout=td) if world > 1 else None
        self.server = (
            _Server(self.layouts[rank], make_optimizer, world, self.gate) if rank in self.layouts else None
        )
        self.clock = 0  # pushes this worker has made
        self.seen = 0  # staleness of the values the last step read
        self.waited = 0.0  # seconds the last step waited for its values
        self._pending: dict[int, list[tuple[Any, Any, torch.Tensor, torch.Tensor]]] = {
            s: [] for s in self.layouts
        }
        self._answers: list[tuple[int, int]] = []  # (remote worker, the clock it enters), gated
        self._stop = threading.Event()
        self._finished = False
        # a receiver thread per other worker, each with its receive always posted: a peer's
        # failure closes that pair and ends its thread; no thread waits on a receive from any source
        self._threads = [
            threading.Thread(
                target=self._serve, args=(w,), name=f"distlab-ps-server-{rank}-from-{w}", daemon=True
            )
            for w in range(world)
            if self.server is not None and w != rank
        ]
        for t in self._threads:
            t.start()

    @property
    def optimizer(self) -> Any:
        """This rank's server optimizer (None off the servers)."""
        return self.server.optimizer if self.server is not None else None

    def targets(self) -> dict[int, SyncUnit]:
        """The server's own tensors by id, with their units (for optimizer state in checkpoints)."""
        return {id(v): u for v, u in zip(self.server.values, self.server.layout.units)} if self.server else {}

    # -- the worker ------------------------------------------------------------------------
    def step(self) -> None:
        """Push this step's gradients to every server, then read the values the consistency allows."""
        t0 = time.perf_counter()
        clock = self.clock
        with self.tracer.span("PS push (stale)" if self.gate is not None else "PS push (async)", "ps"):
            for s, layout in self.layouts.items():
                flat = torch.cat([dense_grad(u).reshape(-1).to(layout.dtype) for u in layout.units])
                flat = flat.div_(self.world).cpu() if self.world > 1 else flat.cpu()
                if s == self.rank:
                    self._server_apply(self.rank, clock, flat)
                    continue
                head = torch.tensor([0, 0], dtype=torch.long)
                values = torch.empty(layout.numel, dtype=layout.dtype)
                self._pending[s].append(
                    (
                        dist.irecv(head, src=s, group=self.reply_group, tag=1),
                        dist.irecv(values, src=s, group=self.reply_group, tag=2),
                        head,
                        values,
                    )
                )
                msg = torch.tensor([PUSH, clock], dtype=torch.long)
                sends = [dist.isend(msg, s, group=self.push_group, tag=1)]
                sends.append(dist.isend(flat, s, group=self.push_group, tag=2))
                for w in sends:  # the server always has a receive posted: this returns promptly
                    self._wait(w, f"rank {s} to take a push")
        self.clock = clock + 1
        with self.tracer.span("PS read (waits for the slowest's clock)", "wait"):
            self.seen = self._read(block=not self.proxy)
        self.waited = time.perf_counter() - t0

    def _server_apply(self, worker: int, clock: int, flat: torch.Tensor) -> None:
        """A push applied on this rank's server (from its thread, or in process from its own
        worker); then every remote worker the new clock ungates gets its answer."""
        assert self.server is not None
        self._check_server()
        with self.server.cond:
            if self.server.apply(worker, clock, flat) and worker != self.rank:
                self._answers.append((worker, clock + 1))
            self._answer()

    def _read(self, block: bool) -> int:
        """Load the newest values every server has answered; ``block``: wait for each server's
        answer to this step's push. Returns the staleness seen: this clock minus the slowest's."""
        seen = 0
        for s, layout in self.layouts.items():
            if s == self.rank:
                flat, clocks = self._local_values(self.clock if block else None)
            else:
                answers = self._pending[s]
                got = None
                while answers and (block or _arrived(answers[0][2])):
                    w_head, w_vals, head, values = answers.pop(0)
                    self._wait(w_head, f"rank {s}'s answer")
                    self._wait(w_vals, f"rank {s}'s answer")
                    got = (values, head)
                if got is None:
                    continue
                flat, clocks = got
            with torch.no_grad():
                for u, piece in zip(layout.units, layout.pieces(flat)):
                    u.view(u.param).copy_(piece.to(u.param.device))
                    if u.shadow is not None:
                        u.shadow.copy_(piece.to(u.shadow.device))
            seen = max(seen, self.clock - int(clocks[0]))
        return seen

    def _local_values(self, clock: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's own server's values, waiting (for ``clock``) on the gate."""
        server = self.server
        assert server is not None
        deadline = time.monotonic() + self.timeout
        with server.cond:
            while clock is not None and not server.ready(clock):
                self._check_server()
                if time.monotonic() > deadline:
                    slow = min(range(self.world), key=lambda w: server.clocks[w])
                    need, at = clock - (self.gate or 0), server.clocks[slow]
                    raise LaunchError(
                        f"rank {self.rank}: waited {self.timeout:g} s for rank {slow} to reach clock {need} "
                        f"(staleness {self.gate}); it stays at {at}"
                    )
                server.cond.wait(0.2)
        return server.snapshot()

    def _wait(self, work: Any, what: str) -> None:
        """Wait for a point-to-point message; the groups' timeout bounds it (a wait with its own
        timeout would close gloo's pair when it expired, and ``is_completed`` of a gloo send or
        receive stays False until it is waited on, so neither slices nor polls can watch it). A
        peer that fails closes the PS groups' connections (``close``), which ends this wait at once
        with an error."""
        try:
            work.wait()
        except RuntimeError as exc:  # a lost peer: run_rank names the rank that failed first
            self._check_server()
            raise RuntimeError(f"rank {self.rank}: waiting for {what}: {str(exc).splitlines()[0]}") from None

    def _check_server(self) -> None:
        """Raise what ended this rank's receiver threads: its own error as it is, a lost connection
        as the RuntimeError gloo gave (run_rank then names the rank that failed first)."""
        err = self.server.error if self.server is not None else None
        if isinstance(err, LaunchError):
            raise err
        if err is not None:
            raise RuntimeError(f"rank {self.rank}: its PS server thread stopped: {str(err).splitlines()[0]}")

    # -- the receiver threads ---------------------------------------------------------------------
    def _serve(self, src: int) -> None:
        """One worker's pushes, in clock order, until it is done (or its connection is lost)."""
        server = self.server
        assert server is not None
        layout = server.layout
        try:
            while not self._stop.is_set():
                head = torch.zeros(2, dtype=torch.long)
                dist.irecv(head, src=src, group=self.push_group, tag=1).wait()
                if int(head[0]) == DONE:
                    with server.cond:
                        server.finish(src)
                        self._answer()
                    return
                flat = torch.empty(layout.numel, dtype=layout.dtype)
                dist.irecv(flat, src=src, group=self.push_group, tag=2).wait()
                self._server_apply(src, int(head[1]), flat)
        except BaseException as exc:  # noqa: BLE001 - the worker thread raises it
            with server.cond:
                if server.error is None and not self._stop.is_set():
                    server.error = exc
                server.cond.notify_all()

    def _answer(self) -> None:
        """(under the server's lock) Send every gated answer the clocks now allow: a snapshot of
        the values and the clocks. The worker posted its receives before it pushed, so each send
        returns as soon as the bytes are across."""
        server = self.server
        assert server is not None
        left = []
        for worker, clock in self._answers:
            if server.ready(clock):
                flat, clocks = server.snapshot()
                dist.send(clocks, worker, group=self.reply_group, tag=1)
                dist.send(flat, worker, group=self.reply_group, tag=2)
            else:
                left.append((worker, clock))
        self._answers = left

    # -- the end -----------------------------------------------------------------------------
    def finish(self, rendezvous: Callable[[], None] | None = None) -> None:
        """At the end of the run: tell every server this worker is done, wait for its answers and
        for this rank's server to have applied every push, meet every rank (``rendezvous``: an
        asynchronous run's, through the store, for as long as a straggler makes progress), then
        every rank takes the servers' final values (a broadcast on the run's group)."""
        for s in self.layouts:
            if s == self.rank:
                assert self.server is not None
                with self.server.cond:
                    self.server.finish(self.rank)
                    self._answer()
            else:
                msg = torch.tensor([DONE, self.clock], dtype=torch.long)
                self._wait(dist.isend(msg, s, group=self.push_group, tag=1), f"rank {s} to hear the end")
        self._read(block=True)
        self._join_servers()
        self._check_server()
        if rendezvous is not None:
            rendezvous()
        self._finished = True
        self.publish()

    def _join_servers(self) -> None:
        """Wait until every other worker has said it is done, for as long as their pushes keep
        coming: a straggler far behind is still training, and only ``timeout`` seconds without a
        single push from any of them fails the run."""
        deadline = time.monotonic() + self.timeout
        applied = -1
        while alive := [t for t in self._threads if t.is_alive()]:
            if self.server is not None:
                with self.server.cond:
                    now_applied = sum(self.server.clocks)
                if now_applied != applied:
                    applied, deadline = now_applied, time.monotonic() + self.timeout
            if time.monotonic() > deadline:
                raise LaunchError(
                    f"rank {self.rank}: its PS server heard nothing from the workers still training "
                    f"for {self.timeout:.0f} s"
                )
            alive[0].join(0.2)  # from one list: a thread may end between two is_alive() calls

    def settle(self, step: int = 0, samples: int = 0) -> tuple[int, int]:
        """Every push of every worker applied and every rank holding the servers' values (a
        checkpoint's consistent cut): this worker's answers drained, a barrier, the broadcast.
        Returns the furthest rank's (``step``, ``samples``): asynchronous ranks stopped by a cancel
        may stand at different steps, and a resume goes on after the furthest (every update is in
        the values; the slower ranks' last batches are skipped, none is trained twice)."""
        self._read(block=True)
        if self.world > 1:
            agreed = torch.tensor([step, samples], dtype=torch.long)
            agreed = on_run_device(agreed)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)  # also the barrier: every rank drained
            step, samples = (int(v) for v in agreed.cpu())
        self.publish()
        return step, samples

    def publish(self) -> None:
        """Every rank's variables to the servers' values (collective on the default group)."""
        if self.server is not None:
            with torch.no_grad():
                for v, u in zip(self.server.values, self.server.layout.units):
                    u.view(u.param).copy_(v.detach().to(u.param.device))
                    if u.shadow is not None:
                        u.shadow.copy_(v.detach().to(u.shadow.device))
        if self.world == 1:
            return
        works = []
        for u in self.units:
            buf = u.view(u.param).detach().contiguous()
            works.append((dist.broadcast(buf, src=u.sync.server, async_op=True), u, buf))
        for w, u, buf in works:
            w.wait()
            with torch.no_grad():
                if buf.data_ptr() != u.view(u.param).data_ptr():
                    u.view(u.param).copy_(buf)
                if u.shadow is not None:
                    u.shadow.copy_(buf)

    def close(self) -> None:
        """After a run that did not finish (an error, a lost rank): close every connection of the
        PS's groups, which ends this rank's receiver threads at once and tells every peer waiting
        on this rank that it is gone (gloo has no abort: a receive's timed wait that expires
        closes every pair of its group, and that is what this does, with 1 ms)."""
        self._stop.set()
        if self._finished or self.world == 1:
            return
        other = (self.rank + 1) % self.world
        for group in (self.push_group, self.reply_group):
            try:
                dist.irecv(torch.empty(1), src=other, group=group, tag=99).wait(
                    datetime.timedelta(milliseconds=1)
                )
            except RuntimeError:
                pass
        for t in self._threads:
            t.join(1.0)
