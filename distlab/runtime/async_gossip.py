"""Asynchronous gossip (BlueFog's windows): every rank at its own pace, no barrier per step.

After its local optimizer step a rank sends its parameters to its out-neighbours through a
one-sided window (runtime/window.py) and combines what has landed from its in-neighbours,
without waiting for anyone:

- ``push_sum`` (Kempe et al. 2003; Assran et al. 2019, SGP): the rank holds a numerator z and a
  weight p, its parameters are z / p. Each step its optimizer's step goes onto the numerator
  (z <- z + x' - x, SGP's local step; scaled by p / ``MASS_FLOOR`` below the floor:
  ``step_scale``), it keeps 1/(d+1) of (z, p) and adds 1/(d+1) into each of its d out-neighbours'
  buffers, then collects every buffer in. Nothing is lost or counted twice, so without
  gradients every rank's z / p reaches the exact average, however unequal the ranks' speeds.
- ``average``: the rank puts its parameters into its out-neighbours' buffers (overwriting), then
  averages its own with the buffers that are new since its last update, equally.

A dynamic topology gives each rank's own clock its graph (its out-neighbours at that clock). A
run ends when every rank has done its steps: ``finish`` waits until every neighbour has said it
sends no more and every message has landed, then push-sum collects the rest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from distlab.runtime.gossip import consensus_distance, write_flat
from distlab.runtime.window import Windows

ONE_THREAD = True  # the exchange's arithmetic on one torch thread (``one_thread``)
MEASURE_EVERY = 8  # clocks between two measurements of the disagreement (each costs passes over the model)
MASS_FLOOR = 0.5  # push-sum's weight below which a rank sends only after it has heard and scales its steps


def neighbours(topology: Any, rank: int) -> tuple[list[int], list[int]]:
    """(in, out) neighbours of ``rank`` over every step of the topology (a dynamic one's period)."""
    graphs = [topology.at(t) for t in range(topology.period)] if hasattr(topology, "at") else [topology]
    ins = sorted({j for g in graphs for j in g.in_neighbors(rank) if j != rank})
    outs = sorted({j for g in graphs for j in g.out_neighbors(rank) if j != rank})
    return ins, outs


def step_scale(p: float) -> float:
    """What a push-sum rank of weight ``p`` multiplies its optimizer's step by on its numerator z:
    1, or p / ``MASS_FLOOR`` below the floor. Its parameters are z / p, so the step moves them by
    the step x scale / p, at most 1 / MASS_FLOOR = 2x the optimizer's. A fast rank sends more mass
    than comes back; its p fell to 0.045-0.12 (digits, the async-gossip benchmark) and its steps,
    unscaled, grew 8-22x: a run's loss stalled (tests/runtime/test_window.py, CI). Keeping p at
    the floor instead (sending only the mass above it) bounded the steps but left such a rank
    sending almost nothing, and a slow rank's consensus stalled (the same file's averaging test)."""
    return 1.0 if p >= MASS_FLOOR else max(p, 0.0) / MASS_FLOOR


@contextmanager
def one_thread(enabled: bool = True) -> Iterator[None]:
    """torch on one thread for the exchange's few passes over the parameters: a parallel region
    per elementwise operation would have the rank's intra-op threads wake (and spin) for
    microseconds of work, on the cores the receiver threads and the other ranks need."""
    before = torch.get_num_threads()
    if not enabled or before == 1 or not ONE_THREAD:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class AsyncGossip:
    """One rank's asynchronous gossip over its parameters' window."""

    asynchronous = True

    def __init__(
        self, tensors: list[torch.Tensor], topology: Any, mode: str, rank: int, world: int, timeout: float
    ) -> None:
        self.tensors, self.topology, self.mode = tensors, topology, mode
        self.rank, self.world = rank, world
        self.windows = Windows(rank, world, timeout)
        ins, outs = neighbours(topology, rank)
        method = "push_sum" if mode == "push_sum" else "average"
        self._x = self._flat()  # the parameters as the last exchange left them (push-sum: z / p)
        self.window = self.windows.create("gossip", self._x, ins, outs, method=method)
        self.clock = 0  # this rank's own exchanges so far
        self.disagreement: float | None = None  # mean squared distance to the neighbours heard
        self.heard = 0  # neighbours heard from this step
        self._handle: Any = None
        self._landed_at_send = 0  # messages landed when push-sum last sent (``_mass_came_back``)

    def graph(self, step: int) -> Any:
        return self.topology.at(step) if hasattr(self.topology, "at") else self.topology

    def in_neighbours(self, step: int) -> list[int]:
        return [int(j) for j in self.graph(step).in_neighbors(self.rank) if j != self.rank]

    def _flat(self) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1).cpu() for t in self.tensors])

    def _write(self, flat: torch.Tensor) -> None:
        write_flat(self.tensors, flat)

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        """Send this rank's stepped parameters and take in what has landed (no wait for anyone)."""
        with one_thread():
            self._exchange()

    def _exchange(self) -> None:
        self._sent()  # at most one step's messages in flight
        self.windows.heartbeat()
        w = self.window
        # a neighbour that has finished takes nothing more in: mass sent there would leave the
        # training for good
        done = self.windows.finished_peers()
        outs = [
            j for j in self.graph(self.clock).out_neighbors(self.rank) if j != self.rank and j not in done
        ]
        if self.mode == "push_sum" and not self._mass_came_back():
            outs = []
        flat = self._flat()
        self._measure(flat, every=MEASURE_EVERY)
        if self.mode == "push_sum":
            # SGP's local step is on the numerator: z <- z + (x' - x), the optimizer's step as it
            # is; a rank heavy with mass (a slow one collects more than it sends) then moves the
            # average no more per step than any other, and faster ranks move it more often. Below
            # MASS_FLOOR the step is scaled by p / MASS_FLOOR (``step_scale``): its parameters move
            # at most 1 / MASS_FLOOR times the optimizer's step
            with w.lock:
                z = w.tensor
            w.set(z + (flat - self._x) * step_scale(w.p), adopt=True)
            share = 1.0 / (len(outs) + 1)
            self._handle = w.accumulate(self_weight=share, dst_weights=dict.fromkeys(outs, share))
            time.sleep(0)  # the GIL to the receiver threads: what has landed is taken in now
            w.update_then_collect()
        else:
            w.set(flat, adopt=True)
            self._handle = w.put(dst_weights=dict.fromkeys(outs, 1.0))
            time.sleep(0)
            fresh = [j for j, v in w.version().items() if v > 0]
            share = 1.0 / (len(fresh) + 1)
            w.update(share, dict.fromkeys(fresh, share))
        self._x = w.value(copy=False)
        self._write(self._x)
        self.clock += 1

    def _mass_came_back(self) -> bool:
        """Push-sum sends this step: its weight p is at least ``MASS_FLOOR``, or mass has landed
        since its last send. A rank that sent 2/3 of its mass each step while nothing came in
        (its in-neighbours not started yet, slower, or finished) would see p dwindle
        geometrically toward 0; below the floor it sends only as often as it hears."""
        landed = sum(self.window.applied.values())
        if self.window.p < MASS_FLOOR and landed == self._landed_at_send:
            return False
        self._landed_at_send = landed
        return True

    def _measure(self, flat: torch.Tensor, every: int = 1) -> None:
        """The step's neighbours heard from since the last step, and every ``every`` clocks the
        disagreement: the mean squared distance to each of them (a push-sum buffer's values over
        its weight), a local view of consensus (None between: it costs passes over the model)."""
        w = self.window
        with w.lock:
            heard = [j for j, v in w.versions.items() if v > 0]
            self.heard = len(heard)
            if self.clock % every:
                self.disagreement = None
                return
            dists = []
            for j in heard:
                other = w.buffers[j] / w.buffer_p[j] if w.method == "push_sum" else w.buffers[j]
                dists.append(float(((flat.to(other.dtype) - other) ** 2).sum()))
        self.disagreement = sum(dists) / len(dists) if dists else None

    def record(self) -> dict[str, Any]:
        """A step's record: this rank's own clock, its disagreement with the neighbours it heard
        from (and how many), and on push-sum its weight p (its share of the mass: the ranks'
        weights, the mass in flight and the mass landed but not yet collected sum to the world)."""
        rec: dict[str, Any] = {"clock": self.clock, "heard": self.heard}
        if self.disagreement is not None:
            rec["disagreement"] = self.disagreement
        if self.mode == "push_sum":
            rec["weight"] = self.window.p
        return rec

    def _drain(self) -> None:
        """Take in everything that has landed: push-sum collects every buffer's mass."""
        if self.mode == "push_sum":
            self.window.update_then_collect()
            self._x = self.window.value(copy=False)
            self._write(self._x)

    def reload(self) -> None:
        """Start over from the parameters as they are (a checkpoint was loaded into them): the
        window's value, weight 1."""
        self._x = self._flat()
        self.window.set(self._x, p=1.0)

    def settle(self) -> None:
        """A consistent cut (a checkpoint): every message sent has landed (and, on push-sum, been
        collected; neighbour averaging takes it in at its next update)."""
        self._sent()
        self.windows.settle()
        self._drain()

    def finish(self) -> None:
        """After this rank's last step: wait until every neighbour has finished too and every
        message has landed, then take the last of them in."""
        self._sent()
        self.windows.finish()
        self._drain()

    def _sent(self) -> None:
        """This rank's last sends are across."""
        if self._handle is not None:
            self._handle.wait()
            self._handle = None

    def close(self) -> None:
        self.windows.close()

    def consensus_distance(self) -> float:
        """Mean over ranks of ||x_r - mean x||^2 (a collective on the run's group)."""
        flat = torch.cat([t.detach().reshape(-1) for t in self.tensors])  # on the run's device (NCCL)
        return consensus_distance(flat, self.world)
