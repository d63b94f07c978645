"""The window protocol's wire format (message headers, tags) and the windows' distributed mutex
(runtime/window.py's ``Windows`` serves both)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from distlab.errors import WindowError

PUT, ACCUMULATE, GET, LOCK, UNLOCK, DONE, ALIVE, GRANT = 1, 2, 3, 4, 5, 6, 7, 8


def header(op: int, wid: int, p: float = 0.0) -> torch.Tensor:
    """A message header: the operation, the window and the push-sum weight (a float64's bits)."""
    return torch.tensor([op, wid, int(torch.tensor([p], dtype=torch.float64).view(torch.long))])


def weight_of(head: torch.Tensor) -> float:
    return float(head[2:3].view(torch.float64))


def tags(wid: int) -> tuple[int, int]:
    """A window's tags: message bodies and get replies (0 is every header's, grants included)."""
    return 16 + 4 * wid, 17 + 4 * wid


class Mutexes:
    """A window's mutex on each rank, as BlueFog's ``win_mutex``: a rank holds it on an owner
    until it releases it, and the owner's ``update(require_mutex=True)`` waits meanwhile. Waiters
    queue in arrival order. A grant is a header (``GRANT``) that the asker's receiver thread
    hands to the waiting caller, so the caller waits with a deadline of its own (a timed gloo
    receive would close the pair when it expired); an asker that gives up sends ``UNLOCK``, which
    takes it out of the owner's queue or, if the grant crossed it, passes the mutex on. Mixed into
    ``Windows``, whose ``group``, ``rank``, ``timeout``, ``isend``, ``heartbeat``, ``wait`` and
    ``check`` it uses."""

    group: Any
    rank: int
    timeout: float
    _grants: dict[tuple[int, int, int], Any]  # (window id, owner, request) -> the Event a lock waits on
    _requests: int  # lock requests this rank has sent

    def isend(self, t: torch.Tensor, dst: int, tag: int) -> Any:
        raise NotImplementedError

    def heartbeat(self) -> None:
        raise NotImplementedError

    def wait(self, work: Any, what: str) -> None:
        raise NotImplementedError

    def check(self) -> None:
        raise NotImplementedError

    def grant_or_queue(self, w: Any, rank: int, request: int = 0) -> None:
        """``rank``'s lock request number ``request``: granted now (the grant echoes the number,
        so a grant that crossed an earlier request's withdrawal never answers a later one) or
        queued."""
        with w.lock:
            w.requests[rank] = request
            if w.holder is None:
                w.holder = rank
                dist.send(header(GRANT, w.wid, request), rank, group=self.group, tag=0)
            else:
                w.queue.append(rank)

    def release(self, w: Any, rank: int) -> None:
        """``rank`` lets go of this rank's mutex of ``w``, or stops waiting for it."""
        with w.lock:
            if w.holder != rank:
                if rank in w.queue:  # a waiter that timed out: out of the queue
                    w.queue.remove(rank)
                return
            w.holder = w.queue.pop(0) if w.queue else None
            if w.holder is not None and w.holder != self.rank:
                grant = header(GRANT, w.wid, w.requests.get(w.holder, 0))
                dist.send(grant, w.holder, group=self.group, tag=0)
            w.lock.notify_all()

    def granted(self, wid: int, owner: int, request: int) -> None:
        """(a receiver thread) ``owner`` granted its mutex of window ``wid`` to lock request
        ``request``: wake that lock; a grant for a request that gave up was already passed on by
        its UNLOCK."""
        event = self._grants.get((wid, owner, request))
        if event is not None:
            event.set()

    def lock(self, w: Any, owner: int) -> None:
        """Take ``owner``'s mutex of window ``w`` (this rank's own: wait until it is free)."""
        if owner == self.rank:
            with w.lock:
                if w.holder is None:
                    w.holder = self.rank
                    return
                w.queue.append(self.rank)
                deadline = time.monotonic() + self.timeout
                while w.holder != self.rank:
                    self.check()
                    if time.monotonic() > deadline:
                        w.queue.remove(self.rank)
                        raise WindowError(
                            f"rank {self.rank}: waited {self.timeout:g} s for window {w.name!r}'s mutex, "
                            f"held by rank {w.holder}"
                        )
                    w.lock.wait(0.2)
            return
        event = threading.Event()
        self._requests += 1
        key = (w.wid, owner, self._requests)
        self._grants[key] = event
        try:
            self.wait(self.isend(header(LOCK, w.wid, key[2]), owner, 0), f"rank {owner}")
            deadline = time.monotonic() + self.timeout
            while not event.wait(0.05):
                self.check()
                self.heartbeat()  # the neighbours keep hearing from this rank while it waits
                if time.monotonic() > deadline:
                    # out of the owner's queue (or, if the grant crossed this, the mutex passed on)
                    self.wait(self.isend(header(UNLOCK, w.wid), owner, 0), f"rank {owner}")
                    raise WindowError(
                        f"rank {self.rank}: waited {self.timeout:g} s for rank {owner}'s mutex of "
                        f"window {w.name!r}; it is held elsewhere (release it with unlock, or hold it "
                        "for less time)"
                    )
        finally:
            self._grants.pop(key, None)

    def unlock(self, w: Any, owner: int) -> None:
        if owner == self.rank:
            self.release(w, self.rank)
            return
        self.wait(self.isend(header(UNLOCK, w.wid), owner, 0), f"rank {owner}")

    @contextmanager
    def mutex_of(self, w: Any) -> Iterator[None]:
        self.lock(w, self.rank)
        try:
            yield
        finally:
            self.unlock(w, self.rank)
