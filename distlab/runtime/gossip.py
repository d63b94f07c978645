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


def step_weights(topology: Any, step: int, rank: int) -> tuple[float, dict[int, float], dict[int, float]]:
    """``rank``'s (self_weight, src_weights, dst_weights) at ``step``, as BlueFog's
    ``neighbor_allreduce`` takes them per call: the topology's own ``neighbor_weights(step, rank)``
    when it has one (a custom schedule), else read off the weights of its graph at that step
    (the column of ``rank`` for what it receives, weight 1 to each out-neighbour)."""
    if hasattr(topology, "neighbor_weights"):
        sw, src, dst = topology.neighbor_weights(step, rank)
        return (
            float(sw),
            {int(k): float(v) for k, v in src.items()},
            {int(k): float(v) for k, v in dst.items()},
        )
    g = topology.at(step) if hasattr(topology, "at") else topology
    w = g.weights
    src = {int(i): float(w[i, rank]) for i in g.in_neighbors(rank) if i != rank}
    return float(w[rank, rank]), src, {int(j): 1.0 for j in g.out_neighbors(rank) if j != rank}


def start_neighbor_allreduce(
    tensor: torch.Tensor, src_weights: dict[int, float], dst_weights: dict[int, float], group: Any = None
) -> tuple[dict[int, torch.Tensor], list[Any]]:
    """Send ``tensor`` times each ``dst_weights[j]`` to j and post a receive from each source
    (BlueFog's ``neighbor_allreduce`` with per-call weights, started); ``finish_neighbor_allreduce``
    combines."""
    wire = host_staged(tensor)
    recv = {j: torch.empty_like(wire) for j in src_weights}
    ops = [dist.P2POp(dist.isend, wire if w == 1.0 else wire * w, j, group) for j, w in dst_weights.items()]
    ops += [dist.P2POp(dist.irecv, recv[j], j, group) for j in recv]
    return recv, dist.batch_isend_irecv(ops) if ops else []


def finish_neighbor_allreduce(
    tensor: torch.Tensor,
    self_weight: float,
    src_weights: dict[int, float],
    started: tuple[dict[int, torch.Tensor], list[Any]],
    wait: Callable[[Any], None] = lambda w: w.wait(),
) -> torch.Tensor:
    """``self_weight * tensor + sum_j src_weights[j] * received_j`` once every message is across."""
    recv, works = started
    for w in works:
        wait(w)  # gloo send/recv works complete only inside wait(): they cannot be polled
    out = tensor * float(self_weight)
    for j, buf in recv.items():
        out.add_(buf.to(tensor.device), alpha=float(src_weights[j]))
    return out


def neighbor_allreduce(
    tensor: torch.Tensor,
    self_weight: float,
    src_weights: dict[int, float],
    dst_weights: dict[int, float],
    group: Any = None,
) -> torch.Tensor:
    """BlueFog's ``neighbor_allreduce(tensor, self_weight, src_weights, dst_weights)``: one
    synchronous exchange with weights given for this call (a dynamic topology's step)."""
    started = start_neighbor_allreduce(tensor, src_weights, dst_weights, group)
    return finish_neighbor_allreduce(tensor, self_weight, src_weights, started)


def write_flat(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy ``flat`` (the tensors concatenated, flattened, in order) back into ``tensors``."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def consensus_distance(
    flat: torch.Tensor, world: int, wait: Callable[[Any], None] = lambda w: w.wait()
) -> float:
    """Mean over ranks of ||x_r - mean_r x_r||^2 (0 when every replica agrees); collective."""
    flat = flat.double()
    mean = flat.clone()
    wait(dist.all_reduce(mean, async_op=True))
    mean /= world
    d = ((flat - mean) ** 2).sum().reshape(1)
    wait(dist.all_reduce(d, async_op=True))
    return float(d.item()) / world


class Gossip:
    """Average the gossip variables with the in-neighbours, with each step's weights
    (``step_weights``: the topology's graph at that step, or its own per-call weights).

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

    def _start(self, step: int, flat: torch.Tensor) -> tuple[Any, Any, torch.Tensor]:
        sw, src, dst = step_weights(self.topology, step, self.rank)
        return (sw, src), start_neighbor_allreduce(flat, src, dst), flat

    def _combine(self, pending: tuple) -> torch.Tensor:
        (sw, src), started, flat = pending
        return finish_neighbor_allreduce(flat, sw, src, started)

    def _write(self, flat: torch.Tensor) -> None:
        write_flat(self.tensors, flat)

    def before_step(self, step: int) -> None:
        if self.mode == "awc" and self.tensors:
            self._pending = self._start(step, self._flat())

    def after_step(self, step: int) -> None:
        if not self.tensors:
            return
        if self.mode == "awc":
            old = self._pending[2]
            avg = self._combine(self._pending)
            self._pending = None
            self._write(avg.add_(self._flat()).sub_(old))
        else:
            self._write(self._combine(self._start(step, self._flat())))

    def consensus_distance(self) -> float:
        """Mean over ranks of ||x_r - mean_r x_r||^2 (0 when every replica agrees)."""
        if not self.tensors:
            return 0.0
        return consensus_distance(self._flat(), self.world, self.wait)
