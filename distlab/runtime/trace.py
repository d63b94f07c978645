"""A rank's timeline, on request (``lab.launch(..., trace=True)``): spans of forward, backward,
the wait for communication, the optimizer, and every collective the step issues.

Two tracks per rank: ``compute`` (what the training loop's thread does: forward, backward,
waiting for gradients, the optimizer, PS pulls, gossip) and ``comm`` (each gradient bucket's
all-reduce and each PS reduce, from the moment backward launches it until its completion
callback runs, so it overlaps backward as it does on the wire; gloo runs two at once, so the
timeline (notebook/timeline.py) gives overlapping ones lanes of their own).

Backward also carries each gradient's ready instant (``args["ready"]``: ``[variable, bytes,
seconds since backward started]`` in the order they became ready), what a replay needs to bucket
the gradients again (distlab/whatif).

Times are wall-clock seconds aligned to rank 0's clock (``align``: the ranks leave a barrier
together and exchange their clocks there), so ranks on different hosts share one time axis.
Each step's spans travel in the step's record (``rec["trace"]``), so a run that fails still
returns every step it recorded. Off (the default), the loop calls ``OFF``, whose spans do nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

_NULL = nullcontext()


class Tracer:
    """One rank's spans (see the module's docstring)."""

    enabled = True

    def __init__(self) -> None:
        self._wall0, self._perf0 = time.time(), time.perf_counter()
        self.offset = 0.0  # seconds to add to this rank's clock to read rank 0's
        self._events: list[dict[str, Any]] = []
        self._pending: list[
            Any
        ] = []  # the futures of collectives whose completion callback may not have run yet
        self._lock = threading.Lock()  # completion callbacks run on the process group's thread
        self._ready: list[tuple[str, int, float]] = []  # (variable, bytes, when) in this step's backward

    def now(self) -> float:
        return time.perf_counter()

    def add(self, name: str, cat: str, start: float, end: float, track: str = "compute", **args: Any) -> None:
        with self._lock:
            self._events.append(
                {"name": name, "cat": cat, "start": start, "end": end, "track": track, "args": args}
            )

    @contextmanager
    def span(self, name: str, cat: str, **args: Any) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, cat, t0, time.perf_counter(), **args)

    def ready(self, variable: str, nbytes: int) -> None:
        """A gradient just became ready (called from its post-accumulate hook during backward)."""
        self._ready.append((variable, nbytes, time.perf_counter()))

    def collective(self, work: Any, name: str, cat: str, **args: Any) -> None:
        """A collective just launched (``work``: its async handle): its span ends when it completes."""
        launched = time.perf_counter()
        future = getattr(work, "get_future", None)
        if future is None:
            return

        def done(fut: Any) -> Any:
            self.add(name, cat, launched, time.perf_counter(), track="comm", **args)
            return None

        self._pending.append(future().then(done))

    def take(self) -> list[dict[str, Any]]:
        """The spans recorded since the last call, as wall-clock seconds on rank 0's clock.

        Called after the step waited for its collectives; their completion callbacks run on the
        process group's thread and may still be on their way, so this waits for each of them."""
        pending, self._pending = self._pending, []
        for fut in pending:
            fut.wait()
        with self._lock:
            events, self._events = self._events, []
        ready, self._ready = self._ready, []
        backward = [e for e in events if e["cat"] == "backward"]
        if ready and backward:  # the step's last backward is the one that syncs
            b = backward[-1]
            b["args"]["ready"] = [[v, n, round(t - b["start"], 7)] for v, n, t in ready]
        base = self._wall0 - self._perf0 + self.offset
        for e in events:
            e["start"], e["end"] = e["start"] + base, e["end"] + base
        return events


class _Off:
    """Tracing off: nothing is recorded and nothing measurable is spent."""

    enabled = False
    offset = 0.0

    def now(self) -> float:
        return 0.0

    def add(self, *args: Any, **kwargs: Any) -> None:
        return None

    def span(self, *args: Any, **kwargs: Any) -> Any:
        return _NULL

    def collective(self, *args: Any, **kwargs: Any) -> None:
        return None

    def ready(self, *args: Any, **kwargs: Any) -> None:
        return None

    def take(self) -> list[dict[str, Any]]:
        return []


OFF = _Off()


def align(tracer: Tracer, rank: int, world: int, device: Any = "cpu") -> None:
    """Set ``tracer.offset`` to rank 0's clock: every rank reads its clock as it leaves a barrier
    and all-gathers it (a barrier releases the ranks within a round trip of each other)."""
    import torch
    import torch.distributed as dist

    if world < 2:
        return
    dist.barrier()
    mine = torch.tensor([time.time()], dtype=torch.float64, device=device)
    every = [torch.zeros(1, dtype=torch.float64, device=device) for _ in range(world)]
    dist.all_gather(every, mine)
    tracer.offset = float(every[0].item() - every[rank].item())
