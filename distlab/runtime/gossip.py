"""Gossip: neighbour averaging of parameters over a (possibly dynamic) topology, ATC or AWC (BlueFog)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distlab.errors import StrategyError


def host_staged(t: torch.Tensor) -> torch.Tensor:
    """``t`` as gloo's point-to-point calls can send it: gloo reads a send's or receive's memory as
    host memory (it has no CUDA path for them, unlike its collectives), so a CUDA tensor goes by
    way of a host copy; NCCL and CPU tensors go as they are."""
    if t.is_cuda and dist.get_backend() == "gloo":
        return t.cpu()
    return t


def resolve_topology(strategy: Any, given: Any = None) -> Any:
    """The topology object: ``given`` if passed, else the one ``strategy.gossip`` names over its ranks."""
    if given is not None:
        return given
    if strategy.gossip is None:
        raise StrategyError(
            f"strategy {strategy.name}: has gossip variables but no gossip settings; set strategy.gossip"
        )
    from distlab.strategy.execution import for_strategy

    return for_strategy(strategy)


class Gossip:
    """Average the gossip variables with the in-neighbours, using the topology's weights.

    Receiver r computes ``x_r <- W[r, r] x_r + sum_j W[j, r] x_j`` over its in-neighbours j
    (``weights[i, j]`` is the weight of edge i -> j). A dynamic topology (one with ``.at(step)``,
    e.g. one-peer exponential-2) gives each step its own graph: one send and one receive per
    rank per step (Ying et al. 2021, "Exponential graph is provably efficient"; BlueFog).
    ATC averages after the local step; AWC sends the pre-step values at the start of the step,
    so the exchange hides behind forward and backward, and adds the local update to the
    average: ``x <- W x_old + (x_step - x_old)``.
    """

    def __init__(
        self,
        tensors: list[torch.Tensor],
        topology: Any,
        mode: str,
        rank: int,
        world: int,
        wait: Callable[[Any], None],
    ) -> None:
        self.tensors, self.topology, self.mode, self.wait = tensors, topology, mode, wait
        self.rank, self.world = rank, world
        self._pending: Any = None

    def graph(self, step: int) -> Any:
        return self.topology.at(step) if hasattr(self.topology, "at") else self.topology

    def in_neighbours(self, step: int) -> list[int]:
        """The ranks this rank averages with at ``step``."""
        return [int(j) for j in self.graph(step).in_neighbors(self.rank) if j != self.rank]

    def _flat(self) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in self.tensors])

    def _start(self, step: int, flat: torch.Tensor) -> tuple[Any, Any, list, torch.Tensor]:
        g = self.graph(step)
        r = self.rank
        ins = [j for j in g.in_neighbors(r) if j != r]
        outs = [j for j in g.out_neighbors(r) if j != r]
        wire = host_staged(flat)
        recv = {j: torch.empty_like(wire) for j in ins}
        ops = [dist.P2POp(dist.isend, wire, j) for j in outs] + [
            dist.P2POp(dist.irecv, recv[j], j) for j in ins
        ]
        works = dist.batch_isend_irecv(ops) if ops else []
        return g, recv, works, flat

    def _combine(self, pending: tuple) -> torch.Tensor:
        g, recv, works, flat = pending
        for w in works:
            w.wait()  # gloo send/recv works complete only inside wait(): they cannot be polled
        w = g.weights
        out = flat * float(w[self.rank, self.rank])
        for j, buf in recv.items():
            out.add_(buf.to(flat.device), alpha=float(w[j, self.rank]))
        return out

    def _write(self, flat: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for t in self.tensors:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n

    def before_step(self, step: int) -> None:
        if self.mode == "awc" and self.tensors:
            self._pending = self._start(step, self._flat())

    def after_step(self, step: int) -> None:
        if not self.tensors:
            return
        if self.mode == "awc":
            old = self._pending[3]
            avg = self._combine(self._pending)
            self._pending = None
            self._write(avg.add_(self._flat()).sub_(old))
        else:
            self._write(self._combine(self._start(step, self._flat())))

    def consensus_distance(self) -> float:
        """Mean over ranks of ||x_r - mean_r x_r||^2 (0 when every replica agrees)."""
        if not self.tensors:
            return 0.0
        flat = self._flat().double()
        mean = flat.clone()
        self.wait(dist.all_reduce(mean, async_op=True))
        mean /= self.world
        d = ((flat - mean) ** 2).sum().reshape(1)
        self.wait(dist.all_reduce(d, async_op=True))
        return float(d.item()) / self.world
