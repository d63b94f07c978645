"""The window protocol's wire format (message headers, tags) and the windows' distributed mutex
(runtime/window.py's ``Windows`` serves both)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from distlab.errors import LaunchError

PUT, ACCUMULATE, GET, LOCK, UNLOCK, DONE, ALIVE = 1, 2, 3, 4, 5, 6, 7


def header(op: int, wid: int, p: float = 0.0) -> torch.Tensor:
    """A message header: the operation, the window and the push-sum weight (a float64's bits)."""
    return torch.tensor([op, wid, int(torch.tensor([p], dtype=torch.float64).view(torch.long))])


def weight_of(head: torch.Tensor) -> float:
    return float(head[2:3].view(torch.float64))


def tags(wid: int) -> tuple[int, int, int]:
    """A window's tags: message bodies, get replies, mutex grants (0 is every header's)."""
    return 16 + 4 * wid, 17 + 4 * wid, 18 + 4 * wid


class Mutexes:
    """A window's mutex on each rank, as BlueFog's ``win_mutex``: a rank holds it on an owner
    until it releases it, and the owner's ``update(require_mutex=True)`` waits meanwhile. Requests
    are answered to a receive the asker posted before asking (no thread waits on another rank's
    thread); waiters queue in arrival order. Mixed into ``Windows``, whose ``group``, ``rank``,
    ``timeout``, ``isend``, ``wait`` and ``check`` it uses."""

    group: Any
    rank: int
    timeout: float

    def isend(self, t: torch.Tensor, dst: int, tag: int) -> Any:
        raise NotImplementedError

    def wait(self, work: Any, what: str) -> None:
        raise NotImplementedError

    def check(self) -> None:
        raise NotImplementedError

    def grant_or_queue(self, w: Any, rank: int) -> None:
        with w.lock:
            if w.holder is None:
                w.holder = rank
                dist.send(torch.ones(1), rank, group=self.group, tag=w.grant_tag)
            else:
                w.queue.append(rank)

    def release(self, w: Any, rank: int) -> None:
        with w.lock:
            if w.holder != rank:
                return
            w.holder = w.queue.pop(0) if w.queue else None
            if w.holder is not None and w.holder != self.rank:
                dist.send(torch.ones(1), w.holder, group=self.group, tag=w.grant_tag)
            w.lock.notify_all()

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
                        raise LaunchError(
                            f"rank {self.rank}: waited {self.timeout:g} s for window {w.name!r}'s mutex, "
                            f"held by rank {w.holder}"
                        )
                    w.lock.wait(0.2)
            return
        grant = torch.zeros(1)
        reply = dist.irecv(grant, src=owner, group=self.group, tag=w.grant_tag)
        self.wait(self.isend(header(LOCK, w.wid), owner, 0), f"rank {owner}")
        self.wait(reply, f"rank {owner}'s mutex of window {w.name!r}")

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
