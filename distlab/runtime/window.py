"""One-sided windows (BlueFog's ``win_*`` operations) on torch.distributed, which has no one-sided
operations: point-to-point mailboxes on a gloo group of their own.

A ``Windows`` holds one rank's group and a receiver thread per neighbour (a rank it sends to or
receives from). Each thread always has a receive posted for its neighbour's next message header,
so a sender never waits on a receiver doing something else, and it applies what arrives under
the window's lock: a ``put`` overwrites the sender's buffer, an ``accumulate`` adds to it, and
either bumps that neighbour's version. A ``get`` asks the owner's thread for a snapshot, which it
sends to a receive the asker posted before asking, so no thread ever waits on another rank's
thread (no cycle, no deadlock); a mutex grant is a header (window_protocol.py). Each window has
its own tags; sends go from snapshots, never from a tensor being updated.

``Window(method="push_sum")`` carries the push-sum weight p with every message (BlueFog's
associated p): ``accumulate`` sends (x w_j, p w_j) and keeps (x w_self, p w_self), which must
sum to the whole (the mass is conserved), ``update_then_collect`` adds every buffer in and
empties them, and ``value()`` is x / p. ``method="average"`` windows combine with weights
that sum to one.

Ending: ``finish`` tells every neighbour this rank sends no more and waits until every
neighbour has said the same (as long as their messages keep coming); ``settle`` is a consistent
cut (every message sent has been applied); ``close`` after a failure closes every connection of
the group, which ends the threads at once and tells the peers this rank is gone.

Long because the message protocol (headers, tags, replies to posted receives, the mutex queue)
and the threads that serve it are one design that reads best in one place.
"""

from __future__ import annotations

import datetime
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from distlab.errors import WindowError
from distlab.runtime.process_group import on_run_device
from distlab.runtime.window_protocol import (
    ACCUMULATE,
    ALIVE,
    DONE,
    GET,
    GRANT,
    LOCK,
    PUT,
    UNLOCK,
    Mutexes,
    header,
    tags,
    weight_of,
)

METHODS = ("average", "push_sum")
TOL = 1e-6
# while windows are open the interpreter switches threads at least this often: a receiver thread
# whose message has landed waits for the GIL, and at the default 5 ms a training loop of 1 ms
# steps would take its neighbours' messages in only every few steps (seen on a 16-core machine)
SWITCH_INTERVAL = 0.0005


class Handle:
    """A non-blocking put or accumulate: its sends and the snapshots they read."""

    def __init__(self, works: list[Any], keep: list[torch.Tensor], windows: Windows, what: str) -> None:
        self.works, self.keep, self.windows, self.what = works, keep, windows, what
        self.done = False

    def wait(self) -> None:
        for w in self.works:
            self.windows.wait(w, self.what)
        self.works, self.keep, self.done = [], [], True


class Window:
    """One named tensor's window on this rank: its value (and push-sum weight), a buffer per
    in-neighbour, and the versions (messages landed since the last update) per in-neighbour."""

    def __init__(
        self,
        windows: Windows,
        wid: int,
        name: str,
        tensor: torch.Tensor,
        in_neighbors: list[int],
        out_neighbors: list[int],
        method: str,
        zero_init: bool,
    ) -> None:
        self.windows, self.wid, self.name, self.method = windows, wid, name, method
        # changed in place only when no send in flight reads it (``_lent``): a send of weight 1
        # reads the tensor itself, and a change then makes a new tensor instead
        self.tensor = tensor.detach().reshape(-1).cpu().clone()  # gloo reads host memory: staged
        self._lent: list[Handle] = []
        self.p = 1.0  # the push-sum weight of this rank's value
        self.in_neighbors, self.out_neighbors = list(in_neighbors), list(out_neighbors)
        size, dtype = self.tensor.numel(), self.tensor.dtype
        self.buffers = {
            j: torch.zeros(size, dtype=dtype) if zero_init else self.tensor.clone() for j in self.in_neighbors
        }
        self.buffer_p = dict.fromkeys(self.in_neighbors, 0.0 if zero_init else 1.0)
        # an emptied buffer is zero whatever its memory holds: the next message lands in it as it is
        self.empty = dict.fromkeys(self.in_neighbors, zero_init)
        self._staging = {j: torch.empty(size, dtype=dtype) for j in self.in_neighbors}
        self.versions = dict.fromkeys(self.in_neighbors, 0)
        self.sent = dict.fromkeys(self.out_neighbors, 0)  # puts and accumulates sent, per out-neighbour
        self.applied = dict.fromkeys(self.in_neighbors, 0)  # landed, per in-neighbour
        self.lock = threading.Condition()
        self.holder: int | None = None  # the rank holding this rank's mutex of the window
        self.queue: list[int] = []  # ranks waiting for it
        self.requests: dict[int, int] = {}  # each rank's latest lock request number
        self.body_tag, self.reply_tag = tags(wid)

    # -- this rank's value -------------------------------------------------------------------
    def value(self, copy: bool = True) -> torch.Tensor:
        """This rank's value: the tensor, divided by its push-sum weight on a push-sum window
        (``copy=False``: an averaging window's tensor itself, to read and not to change)."""
        with self.lock:
            if self.method == "push_sum":
                if self.p <= 0:  # set(p=0): accumulate refuses to give every share away
                    raise WindowError(f"window {self.name!r}: push-sum weight {self.p:g}: value undefined")
                return self.tensor / self.p
            return self.tensor.clone() if copy else self.tensor

    def buffer(self, j: int) -> torch.Tensor:
        """In-neighbour ``j``'s buffer (zeros once emptied)."""
        with self.lock:
            return torch.zeros_like(self.buffers[j]) if self.empty[j] else self.buffers[j].clone()

    def _writable(self) -> bool:
        """(under the lock) No send in flight reads this rank's tensor: it may change in place."""
        self._lent = [h for h in self._lent if not h.done]
        return not self._lent

    def set(self, tensor: torch.Tensor, p: float | None = None, adopt: bool = False) -> None:
        """Replace this rank's tensor (and push-sum weight); ``adopt``: take ``tensor`` itself
        rather than a copy (the caller promises not to change it in place)."""
        flat = tensor.detach().reshape(-1).to("cpu", self.tensor.dtype)
        flat = flat if adopt else flat.clone()
        with self.lock:
            self.tensor = flat
            if p is not None:
                self.p = float(p)

    def version(self) -> dict[int, int]:
        """Messages landed from each in-neighbour since the last update (BlueFog's get_win_version)."""
        with self.lock:
            return dict(self.versions)

    # -- one-sided operations ----------------------------------------------------------------
    def put(
        self, tensor: torch.Tensor | None = None, self_weight: float | None = None, dst_weights: Any = None
    ) -> Handle:
        """Overwrite this rank's buffer on each out-neighbour with ``tensor`` (default: this
        rank's value) times its weight; then this rank's tensor is scaled by ``self_weight``."""
        if self.method == "push_sum":
            raise WindowError(
                f"window {self.name!r}: put overwrites mass a neighbour has not collected; push-sum "
                "sends with accumulate"
            )
        return self._send(PUT, tensor, self_weight, dst_weights)

    def accumulate(
        self, tensor: torch.Tensor | None = None, self_weight: float | None = None, dst_weights: Any = None
    ) -> Handle:
        """Add ``tensor`` (default: this rank's tensor) times its weight into this rank's buffer on
        each out-neighbour. On a push-sum window the weight p goes with it, the default weights are
        1/(out-degree + 1) each, and ``self_weight`` + the ``dst_weights`` must sum to one."""
        if self.method == "push_sum":
            share = 1.0 / (len(self.out_neighbors) + 1)
            self_weight = share if self_weight is None else self_weight
            dst_weights = dict.fromkeys(self.out_neighbors, share) if dst_weights is None else dst_weights
            if float(self_weight) <= 0 or any(float(w) < 0 for w in dict(dst_weights).values()):
                raise WindowError(
                    f"window {self.name!r}: push-sum self_weight={float(self_weight):g} leaves this rank "
                    "no mass (its value tensor / weight would divide by zero) and weights must not be "
                    "negative; keep a self_weight > 0"
                )
            total = float(self_weight) + sum(float(w) for w in dict(dst_weights).values())
            if abs(total - 1.0) > TOL:
                raise WindowError(
                    f"window {self.name!r}: push-sum weights sum to {total:.6g} (self_weight + "
                    "dst_weights); they must sum to 1, or mass is lost or made"
                )
        return self._send(ACCUMULATE, tensor, self_weight, dst_weights)

    def _send(self, op: int, tensor: torch.Tensor | None, self_weight: Any, dst_weights: Any) -> Handle:
        dst = self._weights(dst_weights, self.out_neighbors, "dst_weights", "out-neighbour")
        ws = self.windows
        ws.check()
        with self.lock:
            if tensor is None:
                base = self.tensor
            else:  # the caller's tensor may change once this returns: a copy
                base = tensor.detach().reshape(-1).to(self.tensor.dtype, copy=True)
            p = self.p
            bodies = {j: base if w == 1.0 else base * w for j, w in dst.items()}
            handle = Handle(
                [], list(bodies.values()), ws, f"window {self.name!r}: a put to its out-neighbours"
            )
            if any(b is self.tensor for b in bodies.values()):
                self._lent.append(handle)
            if self_weight is not None:
                sw = float(self_weight)
                self.tensor = self.tensor.mul_(sw) if self._writable() else self.tensor * sw
                self.p *= sw
        for j, w in dst.items():
            head = header(op, self.wid, p * w)
            handle.works += [ws.send_to(head, j, 0), ws.send_to(bodies[j], j, self.body_tag)]
            handle.keep.append(head)
            self.sent[j] += 1
        return handle

    def get(self, src_weights: Any = None) -> None:
        """Fetch each in-neighbour's value (times its weight) into its buffer (BlueFog's win_get)."""
        if self.method == "push_sum":
            raise WindowError(
                f"window {self.name!r}: get copies mass its owner keeps, so a collect would count it "
                "twice; push-sum moves mass with accumulate"
            )
        src = self._weights(src_weights, self.in_neighbors, "src_weights", "in-neighbour")
        ws = self.windows
        ws.check()
        for j, w in src.items():
            head = torch.zeros(3, dtype=torch.long)
            got = torch.empty(self.tensor.numel(), dtype=self.tensor.dtype)
            replies = [dist.irecv(t, src=j, group=ws.group, tag=self.reply_tag) for t in (head, got)]
            ws.wait(ws.isend(header(GET, self.wid), j, 0), f"rank {j}")
            for r in replies:
                ws.wait(r, f"rank {j}'s value of window {self.name!r}")
            with self.lock:
                self.buffers[j] = got if w == 1.0 else got.mul_(float(w))
                self.buffer_p[j] = weight_of(head) * float(w)
                self.empty[j] = False
                self.versions[j] += 1

    def update(
        self,
        self_weight: float | None = None,
        neighbor_weights: Any = None,
        reset: bool = False,
        require_mutex: bool = False,
    ) -> torch.Tensor:
        """This rank's tensor <- self_weight * tensor + sum_j neighbor_weights[j] * buffer_j (the
        push-sum weights alike); ``reset`` empties the buffers. The versions go back to 0.
        Defaults: uniform 1/(in-degree + 1). An averaging window's weights must sum to one."""
        share = 1.0 / (len(self.in_neighbors) + 1)
        sw = share if self_weight is None else float(self_weight)
        nw = self._weights(
            dict.fromkeys(self.in_neighbors, share) if neighbor_weights is None else neighbor_weights,
            self.in_neighbors,
            "neighbor_weights",
            "in-neighbour",
        )
        total = sw + sum(nw.values())
        if self.method == "average" and abs(total - 1.0) > TOL:
            raise WindowError(
                f"window {self.name!r}: update weights sum to {total:.6g} (self_weight + neighbor_weights); "
                "neighbour averaging needs them to sum to 1"
            )
        if self.method == "push_sum" and (sw != 1.0 or any(w != 1.0 for w in nw.values()) or not reset):
            raise WindowError(
                f"window {self.name!r}: push-sum collects every neighbour's mass at weight 1 and empties "
                "the buffers; use update_then_collect()"
            )
        with self.windows.mutex_of(self) if require_mutex else nullcontext(), self.lock:
            if sw == 1.0 and self._writable():
                new = self.tensor
            else:
                new = self.tensor.mul_(sw) if self._writable() else self.tensor * sw
            self.p *= sw
            for j, w in nw.items():
                if not self.empty[j]:
                    new.add_(self.buffers[j], alpha=w)
                    self.p += w * self.buffer_p[j]
                if reset:
                    self.empty[j] = True
                    self.buffer_p[j] = 0.0
                self.versions[j] = 0
            self.tensor = new
            return new

    def update_then_collect(self) -> torch.Tensor:
        """Add every buffer in at weight 1 and empty them, under the mutex (BlueFog's
        win_update_then_collect): push-sum's combine."""
        return self.update(1.0, dict.fromkeys(self.in_neighbors, 1.0), reset=True, require_mutex=True)

    @contextmanager
    def mutex(self, ranks: list[int] | None = None) -> Iterator[None]:
        """Hold this window's mutex on ``ranks`` (default: the out-neighbours), in rank order (two
        holders cannot wait on each other); a rank's own update with ``require_mutex`` waits."""
        targets = sorted(self.out_neighbors if ranks is None else {int(r) for r in ranks})
        held: list[int] = []
        try:
            for r in targets:
                self.windows.lock(self, r)
                held.append(r)
            yield
        finally:
            for r in reversed(held):
                self.windows.unlock(self, r)

    def _weights(self, given: Any, allowed: list[int], field: str, kind: str) -> dict[int, float]:
        out = (
            dict.fromkeys(allowed, 1.0)
            if given is None
            else {int(k): float(v) for k, v in dict(given).items()}
        )
        bad = sorted(set(out) - set(allowed))
        if bad:
            raise WindowError(
                f"window {self.name!r}: {field} names rank {bad[0]}, which is not an {kind} of rank "
                f"{self.windows.rank} ({kind}s: {allowed or 'none'})"
            )
        return out


class Windows(Mutexes):
    """One rank's windows: their gloo group and a receiver thread per neighbour."""

    def __init__(self, rank: int, world: int, timeout: float) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        # every rank makes the group, in the same order as its other groups (new_group is collective)
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
        self.windows: dict[str, Window] = {}
        self._by_id: list[Window] = []
        self._threads: dict[int, threading.Thread] = {}
        self._done_from: set[int] = set()
        self._last_heard = time.monotonic()
        self._said_done = False
        self._error: BaseException | None = None
        self._cv = threading.Condition()
        self._grants, self._requests = {}, 0  # the mutex's lock requests (window_protocol.py)
        self._alive_sent = 0.0
        self._stop = threading.Event()
        self._finished = False
        self._switch = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch, SWITCH_INTERVAL))

    # -- windows -------------------------------------------------------------------------------
    def create(
        self,
        name: str,
        tensor: torch.Tensor,
        in_neighbors: list[int],
        out_neighbors: list[int],
        method: str = "average",
        zero_init: bool = True,
    ) -> Window:
        """A window over ``tensor`` (copied) named ``name``; every rank creates the same windows
        in the same order. Starts a receiver thread for each new neighbour."""
        if name in self.windows:
            raise WindowError(f"window {name!r}: the name is used twice; give each window its own name")
        if method == "push_sum" and not zero_init:
            raise WindowError(
                f"window {name!r}: a push-sum window starts with empty buffers (zero_init=True); buffers "
                "holding copies of the value would add mass at the first collect"
            )
        if method not in METHODS:
            raise WindowError(f"window {name!r}: method {method!r} is not one of: {', '.join(METHODS)}")
        for kind, ranks in (("in", in_neighbors), ("out", out_neighbors)):
            bad = [r for r in ranks if not 0 <= r < self.world or r == self.rank]
            if bad:
                raise WindowError(
                    f"window {name!r}: {kind}_neighbors of rank {self.rank} holds {bad[0]}; a neighbour is "
                    f"another rank in 0..{self.world - 1}"
                )
        if not in_neighbors and self.world > 1:
            raise WindowError(
                f"window {name!r}: rank {self.rank} has no in-neighbour, so it never hears from anyone; "
                "use a topology in which every rank receives from another"
            )
        w = Window(self, len(self._by_id), name, tensor, in_neighbors, out_neighbors, method, zero_init)
        with self._cv:
            self.windows[name] = w
            self._by_id.append(w)
            self._cv.notify_all()
        for peer in sorted(set(in_neighbors) | set(out_neighbors)):
            if peer not in self._threads:
                t = threading.Thread(
                    target=self._serve, args=(peer,), name=f"distlab-window-{self.rank}-{peer}"
                )
                t.daemon = True
                self._threads[peer] = t
                t.start()
        return w

    def __getitem__(self, name: str) -> Window:
        try:
            return self.windows[name]
        except KeyError:
            raise WindowError(f"window {name!r}: no such window; create it first") from None

    # -- messages --------------------------------------------------------------------------------
    def isend(self, t: torch.Tensor, dst: int, tag: int) -> Any:
        return dist.isend(t, dst, group=self.group, tag=tag)

    def send_to(self, t: torch.Tensor, dst: int, tag: int) -> Any:
        """``isend``, a lost connection named: what ended a receiver thread, else the peer."""
        try:
            return self.isend(t, dst, tag)
        except RuntimeError as exc:
            self.check()
            raise RuntimeError(
                f"rank {self.rank}: sending to rank {dst}: {str(exc).splitlines()[0]}"
            ) from None

    def wait(self, work: Any, what: str) -> None:
        """Wait for a message under the group's timeout (a timed gloo wait closes the pair when it
        expires, and gloo cannot poll a send or receive): a lost peer ends it with an error."""
        try:
            work.wait()
        except RuntimeError as exc:
            self.check()
            raise RuntimeError(f"rank {self.rank}: waiting for {what}: {str(exc).splitlines()[0]}") from None

    def check(self) -> None:
        """Raise what ended a receiver thread: a window's own error as it is, a lost connection as
        gloo gave it (the run then names the rank that failed first)."""
        err = self._error
        if isinstance(err, WindowError):
            raise err
        if err is not None:
            raise RuntimeError(
                f"rank {self.rank}: a window's receiver thread stopped: {str(err).splitlines()[0]}"
            )

    def _serve(self, src: int) -> None:
        """Every message from ``src`` until it says it is done (or its connection is lost). The
        receive of each window's next body from ``src`` stays posted, so a put's bytes flow as
        soon as they are sent (gloo sends only into a posted receive); the one left posted at the
        end is dropped unmatched, which gloo allows."""
        posted: dict[int, Any] = {}  # window id -> the posted receive of src's next body
        try:
            while not self._stop.is_set():
                self._post_bodies(src, posted)
                head = torch.zeros(3, dtype=torch.long)
                dist.irecv(head, src=src, group=self.group, tag=0).wait()
                op, wid = int(head[0]), int(head[1])
                self._last_heard = time.monotonic()
                if op == DONE:
                    with self._cv:
                        self._done_from.add(src)
                        self._cv.notify_all()
                    return
                if op == ALIVE:
                    continue
                w = self._window(wid)
                if op in (PUT, ACCUMULATE):
                    self._post_bodies(src, posted)
                    self._land(w, src, op, weight_of(head), posted.pop(w.wid))
                elif op == GET:  # to receives the asker posted before asking
                    with w.lock:
                        snap, p = w.tensor.clone(), w.p  # this rank may change it once unlocked
                    dist.send(header(GET, wid, p), src, group=self.group, tag=w.reply_tag)
                    dist.send(snap, src, group=self.group, tag=w.reply_tag)
                elif op == LOCK:
                    self.grant_or_queue(w, src, int(weight_of(head)))
                elif op == UNLOCK:
                    self.release(w, src)
                elif op == GRANT:
                    self.granted(w.wid, src, int(weight_of(head)))
        except BaseException as exc:  # noqa: BLE001 - the training thread raises it
            if self._error is None and not self._stop.is_set():
                self._error = exc
            with self._cv:
                self._cv.notify_all()
            for w in self._by_id:
                with w.lock:
                    w.lock.notify_all()

    def _window(self, wid: int) -> Window:
        """Window ``wid``, once this rank has created it too (a faster peer may use it first)."""
        deadline = time.monotonic() + self.timeout
        with self._cv:
            while wid >= len(self._by_id):
                if time.monotonic() > deadline or self._stop.is_set():
                    raise WindowError(
                        f"rank {self.rank}: a peer used window {wid}, which this rank never created"
                    )
                self._cv.wait(0.05)
            return self._by_id[wid]

    def _post_bodies(self, src: int, posted: dict[int, Any]) -> None:
        """Post the receive of ``src``'s next body into each window that has ``src`` as an
        in-neighbour and none posted (windows created since are included)."""
        for w in list(self._by_id):
            if w.wid not in posted and src in w._staging:
                posted[w.wid] = dist.irecv(w._staging[src], src=src, group=self.group, tag=w.body_tag)

    def _land(self, w: Window, src: int, op: int, p: float, work: Any) -> None:
        staging = w._staging[src]
        work.wait()
        with w.lock:
            if op == PUT or w.empty[src]:  # the staging buffer becomes the neighbour's: no copy
                w._staging[src], w.buffers[src] = w.buffers[src], staging
                w.buffer_p[src] = p
                w.empty[src] = False
            else:
                w.buffers[src].add_(staging)
                w.buffer_p[src] += p
            w.versions[src] += 1
            w.applied[src] += 1
            w.lock.notify_all()

    # -- the end ---------------------------------------------------------------------------------
    def settle(self, run_group: Any = None) -> None:
        """A consistent cut: every put and accumulate any rank has sent has landed (an all-reduce
        of who sent what to whom on the run's group, then a wait for each count)."""
        counts = torch.zeros(len(self._by_id), self.world, self.world, dtype=torch.long)
        for w in self._by_id:
            for j, n in w.sent.items():
                counts[w.wid, self.rank, j] = n
        counts = on_run_device(counts)
        work = dist.all_reduce(counts, group=run_group, async_op=True)
        while not work.is_completed():  # (a collective's completion polls) neighbours keep hearing
            self.heartbeat()
            time.sleep(0.001)
        work.wait()
        counts = counts.cpu()
        deadline = time.monotonic() + self.timeout
        for w in self._by_id:
            with w.lock:
                while any(w.applied[i] < int(counts[w.wid, i, self.rank]) for i in w.in_neighbors):
                    self.check()
                    if time.monotonic() > deadline:
                        raise WindowError(
                            f"rank {self.rank}: window {w.name!r}: messages did not land in time"
                        )
                    w.lock.wait(0.2)

    def finished_peers(self) -> set[int]:
        """The neighbours that have said they send no more (their runs are over)."""
        with self._cv:
            return set(self._done_from)

    def heartbeat(self) -> None:
        """(each step of a rank still training) Tell every neighbour this rank is alive, at most
        every quarter of the timeout. A receiver thread's wait for its neighbour's next header is
        bounded by the group's timeout (gloo closes the pair when it expires), and on a directed
        graph (exp2) a neighbour may never send anything else: its thread must hear from it. A
        finished rank also waits for a slower one for as long as it hears from it."""
        now = time.monotonic()
        if now - self._alive_sent < self.timeout / 4:
            return
        self._alive_sent = now
        for peer in sorted(self._threads):
            self.wait(self.send_to(header(ALIVE, 0), peer, 0), f"rank {peer}")

    def finish(self) -> None:
        """This rank sends no more: say so to every neighbour, then wait until each has said the
        same (for as long as their messages keep coming: a slower neighbour is still training)."""
        if self._said_done:
            return
        self._said_done = True
        done = header(DONE, 0)
        for peer in sorted(self._threads):
            self.wait(self.isend(done, peer, 0), f"rank {peer} to hear the end")
        with self._cv:
            while len(self._done_from) < len(self._threads):
                self.check()
                silent = time.monotonic() - self._last_heard
                if silent > self.timeout:
                    waiting = sorted(set(self._threads) - self._done_from)
                    raise WindowError(
                        f"rank {self.rank}: ranks {waiting} sent nothing for {self.timeout:g} s and did not "
                        "finish"
                    )
                self._cv.wait(0.2)
        for t in self._threads.values():
            t.join(self.timeout)
        self.check()
        self._finished = True
        sys.setswitchinterval(self._switch)

    def close(self) -> None:
        """After a run that did not finish: close every connection of the group (a receive's timed
        wait that expires closes them all; gloo has no abort), which ends the receiver threads and
        tells every peer this rank is gone."""
        self._stop.set()
        sys.setswitchinterval(self._switch)
        if self._finished or self.world == 1:
            return
        other = (self.rank + 1) % self.world
        try:
            dist.irecv(torch.empty(1), src=other, group=self.group, tag=3).wait(
                datetime.timedelta(milliseconds=1)
            )
        except RuntimeError:
            pass
        for t in self._threads.values():
            t.join(1.0)

    def alive(self) -> list[str]:
        """Names of this rank's receiver threads still running (tests: none after the end)."""
        return [t.name for t in self._threads.values() if t.is_alive()]
