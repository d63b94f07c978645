"""Rendezvous and process-group lifetime for one rank: backend choice, timeouts, failure and stop signals."""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from distlab.errors import LaunchError
from distlab.resources import host_of

# Keys under the run's prefix in the rendezvous store.
ERROR_KEY = "error"  # "<rank>\t<one-line cause>" of the first rank that failed
STOP_KEY = "stop"  # the step before which every rank stops (agreed through the store)


_USER_IFNAME = {k: os.environ.get(k) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}


def rank_host() -> str:
    """(worker) The host this rank is reached at: its Dask worker's address (the cluster's view of
    hosts, as ``lab.resources`` groups ranks), else the machine's name outside a worker."""
    try:
        from distributed import get_worker

        return host_of(get_worker().address)
    except (ImportError, ValueError):
        import socket

        return socket.gethostname()


def bind_interface() -> str | None:
    """(worker) Make gloo (and NCCL's bootstrap) use the interface that holds this worker's
    address, unless the user chose one (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``).

    By default gloo binds to the address the machine's name resolves to, which is loopback on many
    hosts (Debian maps it to 127.0.1.1): its peers on other hosts then dial their own loopback.
    Returns the interface chosen, None when nothing was changed (loopback, or not found).
    """
    host = rank_host()
    if host.startswith("127.") or host in ("localhost", "::1"):
        return None
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == host for a in addrs):
            for key, user in _USER_IFNAME.items():
                if user is None:
                    os.environ[key] = name
            return name
    return None


def resolve_backend(backend: str, device: str) -> str:
    """``auto`` -> ``nccl`` for a ``cuda`` device, ``gloo`` otherwise."""
    if backend == "auto":
        return "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl" and not device.startswith("cuda"):
        raise LaunchError(
            f"strategy.backend: nccl needs a cuda device, this rank has {device!r}; use 'gloo' or 'auto'"
        )
    return backend


def connect_store(addr: str, port: int, world: int, timeout: float, run_id: str, store: Any = None) -> Any:
    """A client connection to the run's ``TCPStore`` (or the given store), prefixed by ``run_id``.

    The prefix lets one store host several runs one after the other (tests, warm relaunches).
    """
    td = datetime.timedelta(seconds=timeout)
    if store is None:
        try:
            store = dist.TCPStore(addr, port, world, False, timeout=td)
        except Exception as exc:  # noqa: BLE001 - one line naming the address is the useful part
            raise LaunchError(
                f"rendezvous {addr}:{port}: cannot connect within {timeout:g} s ({exc})"
            ) from None
    return dist.PrefixStore(f"distlab/{run_id}/", store)


def on_run_device(t: torch.Tensor) -> torch.Tensor:
    """``t`` where the run's default group can reduce it: NCCL reduces CUDA tensors only (a
    small CPU tensor of counters or steps goes to this rank's device and back)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return t.to(f"cuda:{torch.cuda.current_device()}")
    return t


def block(work: Any) -> None:
    """The plain wait (no failure watch): for code outside a run."""
    work.wait()


class Waiter:
    """Wait for async collectives while watching the store for another rank's failure.

    A gloo peer that fails does not reliably close its sockets (they stay open while its
    process lives), so a plain ``work.wait()`` would sit until the collective timeout.
    Waiting in slices and checking the run's error key between them turns a peer's failure
    into a ``LaunchError`` naming it within a fraction of a second.
    """

    def __init__(self, store: Any, rank: int, poll: float = 0.2) -> None:
        self.store, self.rank, self.poll = store, rank, poll
        self.abandoned = False

    def wait(self, work: Any) -> None:
        # Block in slices of ``poll`` seconds (a timed-out gloo wait leaves the work waitable)
        # and look for a peer's failure between slices: no busy polling on a shared CPU.
        if work.is_completed():
            work.wait()
            return
        slice_ = datetime.timedelta(seconds=self.poll)
        while True:
            try:
                work.wait(slice_)
                return
            except RuntimeError as exc:
                if "Operation timed out" not in str(exc):
                    raise
            other = failure_of_other(self.store, self.rank, wait=0.0)
            if other is not None:
                self.abandoned = True
                raise LaunchError(f"rank {self.rank}: stopped because rank {other[0]} failed: {other[1]}")


# A group whose collective was abandoned cannot be destroyed until that collective ends (the
# peer's process exits or the timeout fires); it is destroyed in the background and the next
# group in this process waits for that first. Process-wide because torch's default group is.
_pending_teardown: list[threading.Thread] = []


@contextmanager
def process_group(
    store: Any, rank: int, world: int, backend: str, timeout: float, device: str
) -> Iterator[Waiter]:
    """The default process group for the duration of the block; always destroyed on exit."""
    while _pending_teardown:
        _pending_teardown.pop().join(timeout)
    if dist.is_initialized():  # a previous run in this long-lived worker left one behind
        dist.destroy_process_group()
    _reset_group_names()
    if backend == "nccl":
        torch.cuda.set_device(torch.device(device))
    try:
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout)
        )
    except Exception as exc:  # noqa: BLE001
        raise LaunchError(
            f"rank {rank}: process group ({backend}, {world} ranks) did not form within {timeout:g} s: {exc}"
        ) from None
    waiter = Waiter(store, rank)
    failed = False
    try:
        yield waiter
    except BaseException:
        failed = True
        raise
    finally:
        if failed and backend == "nccl":
            _abort()
        if waiter.abandoned:
            t = threading.Thread(target=_destroy, name="distlab-pg-teardown", daemon=True)
            t.start()
            _pending_teardown.append(t)
        else:
            _destroy()


def _reset_group_names() -> None:
    """A default group whose rendezvous failed leaves torch's group counter raised, so this
    long-lived worker would name its next group differently from its peers and never meet them.
    With no group alive the counter must be 0, as destroy_process_group leaves it."""
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized() and getattr(c10d._world, "group_count", 0):
        c10d._world.group_count = 0


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class PeerFailed(LaunchError):
    """A rank that stopped because another rank failed: the run reports the other's error.

    ``peer`` and ``cause`` are that rank and its "Kind: message", so the driver can name it
    even when this error reaches the client before the peer's own."""

    def __init__(self, rank: int, peer: int, cause: str) -> None:
        super().__init__(f"rank {rank}: stopped because rank {peer} failed: {cause}")
        self.rank, self.peer, self.cause = rank, peer, cause

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.rank, self.peer, self.cause))


def abort_groups() -> bool:
    """Abort every process group of this rank (the default one and the runtime's own: PS,
    windows, gossip), so a peer blocked in a collective with it fails at once; True when the
    default group was aborted. Best effort: a backend without ``abort`` is left to ``_destroy``."""
    from torch.distributed import distributed_c10d as c10d

    if not dist.is_initialized():
        return False
    default = c10d._get_default_group()
    done = False
    for pg in [g for g in list(getattr(c10d._world, "pg_map", {})) if g is not default] + [default]:
        try:
            pg.abort()
            done = done or pg is default
        except Exception:  # noqa: BLE001 - aborting is an optimisation; destroy follows
            pass
    return done


def _abort() -> None:
    """Abort the default group (NCCL: unblocks pending kernels); best effort, destroy follows."""
    try:
        if dist.is_initialized():
            dist.distributed_c10d._get_default_group().abort()
    except Exception:  # noqa: BLE001
        pass


def report_failure(store: Any, rank: int, cause: str) -> None:
    """Record this rank as the failing one, unless another rank was first."""
    try:
        store.compare_set(ERROR_KEY, "", f"{rank}\t{cause}")
    except Exception:  # noqa: BLE001 - the store may be gone; the local error still surfaces
        pass


def failure_of_other(store: Any, rank: int, wait: float = 2.0) -> tuple[int, str] | None:
    """The (rank, cause) another rank reported, waiting up to ``wait`` seconds for it to appear."""
    deadline = time.monotonic() + wait
    while True:
        try:
            if store.check([ERROR_KEY]):
                who, _, cause = store.get(ERROR_KEY).decode().partition("\t")
                return (int(who), cause) if int(who) != rank else None
        except Exception:  # noqa: BLE001
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


class StopSignal:
    """Agree on a step to stop at, through the store, when any rank's ``should_stop()`` says so.

    The first rank that wants to stop before step t writes ``t + margin``; ranks run in near
    lockstep (every step has a collective, gossip ranks drift at most the graph diameter), so
    every rank reads the key before it reaches that step and all stop at the same one. On fast
    steps the store is read every ``period`` steps only (a round trip per step is measurable on
    small models), so the margin grows by the period; a rank also reads whenever ``interval``
    seconds passed since its last read, so on slow steps (this rank's last three steps each at
    least twice ``interval``: every rank, in lockstep, then reads at every step; one slow step, a
    hiccup, is not enough) the margin grows by one step only, and a cancel stops a model of 1 s
    steps in about 3 s, not 6.

    ``at_once`` (asynchronous runs, whose ranks are not in lockstep): each rank stops at the first
    step boundary after it reads the key, where it stands; no rank trains on to reach the
    requester's step (a straggler far behind would keep the others waiting for it).

    In lockstep runs (not ``at_once``) the reads every ``period`` steps are made by a reader thread
    while the step trains, and their answer is taken at the next step's boundary (waiting for it
    there if it is late), so the margin on fast steps counts one step more. A read on the training
    thread cost a 3 ms step about 0.06 ms here (a store round trip every fourth step; 2 workers, the
    own-loop benchmark's 0.34 MB MLP). The reader ends at ``close`` or after ``READER_IDLE`` seconds
    without a read; the next read starts another.
    """

    READER_IDLE = 5.0

    def __init__(
        self,
        store: Any,
        should_stop: Any,
        margin: int,
        period: int = 4,
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        at_once: bool = False,
    ) -> None:
        self.store, self.should_stop, self.period = store, should_stop, max(1, period)
        self.at_once = at_once
        self.base, self.interval, self.clock = margin, interval, clock
        self.target: int | None = None
        self._last_read = clock()
        self._last_call: float | None = None  # None before the first step
        self._steps_s: list[float] = []  # the last three steps' seconds, the time to setup excluded
        self._lock = threading.Lock()
        self._ask = threading.Condition(self._lock)
        self._asked = False  # a read is wanted or under way
        self._answer: tuple[int | None, BaseException | None] | None = None
        self._reader: threading.Thread | None = None
        self._closed = False

    def margin(self) -> int:
        """Steps between a request and the agreed stop: one more than the base when this rank's
        steps are slow enough that every rank reads the store at each step."""
        slow = len(self._steps_s) == 3 and min(self._steps_s) >= 2 * self.interval
        return self.base + (1 if slow else self.period + 1)

    def stop_before(self, step: int) -> bool:
        if self.should_stop is None:
            return False
        now = self.clock()
        if self._last_call is not None:
            self._steps_s = [*self._steps_s[-2:], now - self._last_call]
        self._last_call = now
        if self.target is None:
            self.target = self._answered()
        if self.target is None:
            wants = self.should_stop()
            if wants:
                self.store.compare_set(STOP_KEY, "", str(step + self.margin()))
            if wants or now - self._last_read >= self.interval:  # at once, on this thread
                self._last_read = now
                self.target = self._read()
            elif step % self.period == 0:
                self._last_read = now
                if self.at_once:  # where it stands: a read beside the step would see a later store
                    self.target = self._read()
                else:
                    self._read_beside()
        return self.target is not None and (self.at_once or step >= self.target)

    def _read(self) -> int | None:
        return int(self.store.get(STOP_KEY).decode()) if self.store.check([STOP_KEY]) else None

    def _read_beside(self) -> None:
        """Ask the reader thread for a read (started when none is running; after ``close``, the
        read is made here)."""
        if self._closed:
            self.target = self._read()
            return
        with self._lock:
            self._asked, self._answer = True, None
            if self._reader is None:
                self._reader = threading.Thread(target=self._reads, name="distlab-stop-reader", daemon=True)
                self._reader.start()
            self._ask.notify()

    def _answered(self) -> int | None:
        """The answer of the read asked at an earlier step, waited for; None when none was asked.
        Waited for in slices (an abort raised in this thread lands between them); a reader gone
        without answering (closed) leaves the read to this thread."""
        with self._lock:
            while self._asked and self._answer is None and self._reader is not None:
                self._ask.wait(0.1)
            asked, answer = self._asked, self._answer
            self._asked, self._answer = False, None
        if answer is None:
            return self._read() if asked else None
        target, error = answer
        if error is not None:
            raise error
        return target

    def close(self) -> None:
        """The run's loop is over: the reader thread, if any, ends now."""
        with self._lock:
            self._closed = True
            self._ask.notify_all()

    def _reads(self) -> None:
        while True:
            with self._lock:
                if not (self._asked and self._answer is None) and not self._closed:
                    self._ask.wait(self.READER_IDLE)
                if self._closed or not (self._asked and self._answer is None):
                    self._reader = None  # idle or closed: a later read starts another
                    return
            try:
                answer: tuple[int | None, BaseException | None] = (self._read(), None)
            except BaseException as exc:  # noqa: BLE001 - raised on the training thread, where it is taken
                answer = (None, exc)
            with self._lock:
                self._answer = answer
                self._ask.notify_all()

    def requested(self) -> bool:
        try:
            return bool(self.store.check([STOP_KEY]))
        except Exception:  # noqa: BLE001
            return False
