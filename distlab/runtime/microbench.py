"""Rank-side microbenchmarks that calibration runs: collectives over message sizes, compute under contention.

``microbench_rank`` runs inside an already initialised ``torch.distributed`` process group (or
sub-group) on every member rank; every rank returns the same rows, because each measurement is
reduced with MAX across ranks (a collective is as slow as its slowest rank). The rows feed
``CostModel.from_microbenchmarks``; their schema is ``costmodel.rows.CollectiveRow`` (dicts
here: the runtime does not import the cost model). Its compute rows (GEMM, optimizers, copies)
are measured by microbench_compute.py, whole training steps by loopbench.py.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from distlab.runtime.microbench_compute import rank_compute_rows, time_reps
from distlab.runtime.process_group import rank_host
from distlab.runtime.progress import tick

# buckets are <= 4 MiB; larger messages (a big variable to its server) follow the fitted beta
DEFAULT_SIZES = (4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20)
# the link between two hosts, measured alone: messages well past a shaped link's burst and TCP's
# start-up, so the fit's bytes term is the link's rate (small ones measured the burst)
LINK_SIZES = (1 << 20, 4 << 20, 16 << 20)
MAX_FLOWS = 3  # concurrent flows into (and out of) one host's link measured: 2 .. MAX_FLOWS
COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "sendrecv")


def _max_mean(times: list[float], group: Any) -> float:
    """Mean over repeats of the slowest rank's time (MAX across ranks per repeat).

    The mean, not the median: a message on this VM lands in one of two modes (about 0.5 or 3.5 ms
    at small sizes) and a median takes whichever mode most repeats fell in, while a training step
    pays their mix. Medians put 16 fresh calibrations' all-reduce of 4 MiB at 0.51-4.10 ms and the
    loop stage then scaled the wire by 0.91-1.66 (``comm_scale``); means over repeats spread in
    time, 2.66-3.76 ms and 0.83-1.08 over 20 (datasets/measurements/calibration-repeat-2026-11-29b)."""
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(statistics.mean(t.tolist()))


def point_schedule(points: Sequence[Any], repeats: int) -> list[Any]:
    """The order the collectives' points are timed in after their first repeat: round after round
    over every point, so each point's repeats lie apart in time (a slow moment of the machine hits
    every point a little, not one point wholly)."""
    return [p for _ in range(max(repeats - 1, 0)) for p in points]


def _op(name: str, nbytes: int, local: int, members: Sequence[int], group: Any) -> Any:
    numel = max(nbytes // 4, 1)
    x = torch.ones(numel, dtype=torch.float32)
    root = members[0]
    if name == "allreduce":
        return lambda: dist.all_reduce(x, group=group)
    if name == "reduce":
        return lambda: dist.reduce(x, dst=root, group=group)
    if name == "broadcast":
        return lambda: dist.broadcast(x, src=root, group=group)
    if name == "allgather":
        outs = [torch.empty_like(x) for _ in members]
        return lambda: dist.all_gather(outs, x, group=group)
    if name == "sendrecv":  # pairs (0,1), (2,3), ... swap buffers at once, as gossip neighbours do
        partner = local ^ 1
        if partner >= len(members):
            return lambda: None
        peer = members[partner]
        y = torch.empty_like(x)

        def exchange() -> None:
            ops = [dist.P2POp(dist.isend, x, peer, group), dist.P2POp(dist.irecv, y, peer, group)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return exchange
    if name == "send":  # pairs (0,1), (2,3), ...: the first sends, the second receives (one way)
        partner = local ^ 1
        if partner >= len(members):
            return lambda: None
        peer = members[partner]
        if local % 2 == 0:
            return lambda: dist.send(x, peer, group=group)
        y = torch.empty_like(x)
        return lambda: dist.recv(y, peer, group=group)
    raise ValueError(f"collectives: unknown {name!r}; expected some of {COLLECTIVES}")


def _incast(local: int, members: Sequence[int], group: Any, x: torch.Tensor, ys: list[torch.Tensor]) -> Any:
    """Every member but the first sends ``x`` to the first, which receives them all at once."""

    def run() -> None:
        if local:
            dist.send(x, members[0], group=group)
            return
        for w in [dist.irecv(y, peer, group=group) for y, peer in zip(ys, members[1:])]:
            w.wait()

    return run


def _outcast(local: int, members: Sequence[int], group: Any, x: torch.Tensor, ys: list[torch.Tensor]) -> Any:
    """The first member sends ``x`` to every other at once."""

    def run() -> None:
        if local:
            dist.recv(ys[0], members[0], group=group)
            return
        for w in [dist.isend(x, peer, group=group) for peer in members[1:]]:
            w.wait()

    return run


def shared_link_rows(
    rank: int, members: Sequence[int], group: Any, sizes: Sequence[int], repeats: int, time_budget: float
) -> list[dict[str, Any]]:
    """One host's link shared by concurrent one-way flows: ``k = len(members) - 1`` ranks on other
    hosts send ``nbytes`` each into ``members[0]`` at once (``incast``), then ``members[0]`` sends
    ``nbytes`` to each of them at once (``outcast``). Rows as ``microbench_rank``'s, with ``flows``: k.
    """
    local = members.index(rank)
    k = len(members) - 1
    base = {"world": len(members), "link": "inter", "repeats": repeats, "flows": k}
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for nbytes in sorted(sizes):
        over = torch.tensor([float(time.perf_counter() - start > time_budget)])
        dist.all_reduce(over, op=dist.ReduceOp.MAX, group=group)
        if over.item() > 0:
            break
        x = torch.ones(max(int(nbytes) // 4, 1), dtype=torch.float32)
        ys = [torch.empty_like(x) for _ in members[1:]]
        for name, fn in (
            ("incast", _incast(local, members, group, x, ys)),
            ("outcast", _outcast(local, members, group, x, ys)),
        ):
            seconds = _max_mean(time_reps(fn, repeats, group), group)
            tick(f"{name} {nbytes} B from {k}")
            rows.append({**base, "collective": name, "nbytes": int(nbytes), "seconds": seconds})
    return rows


def microbench_rank(
    rank: int,
    world: int,
    group: Any = None,
    sizes: Sequence[int] | None = None,
    collectives: Sequence[str] = COLLECTIVES,
    repeats: int = 5,
    compute: bool = True,
    time_budget: float = 20.0,
) -> list[dict[str, Any]]:
    """Measure every collective at every size, and the compute workload alone vs all ranks busy.

    ``rank``: this process's global rank; ``world``: the size of ``group`` (the default group
    when None). Each point's ``seconds`` is the mean of its ``repeats``, taken round after round
    over every point (``_collective_points``); sizes run smallest first, and once the first round,
    scaled to all repeats, passes ``time_budget`` seconds on any rank the larger sizes are skipped
    (all ranks agree). Rows: ``collective, world, nbytes, seconds, link, repeats`` (sendrecv: a
    pairwise exchange, each rank sending and receiving ``nbytes`` at once as a gossip step does;
    allgather: bytes contributed per rank), then a ``compute`` row (``seconds`` all busy,
    ``alone``, ``contention``, ``threads``, ``flops``, ``ranks_on_host``, ``cores``), an
    ``optimizer`` row (seconds per step of the runtime's default optimizer over ``nbytes``
    parameter bytes: ``seconds`` all ranks busy, ``alone`` one rank at a time; the cost model
    applies its own contention to the latter) and a ``copy`` row (a bucket's flatten of
    ``nbytes``, one rank at a time); both of the last with their bytes out of cache, as in a
    training step, their ``alone`` the mean of ``microbench_compute.PER_BYTE_REPEATS`` taken in
    turn with the ``optimizer:<kind>`` rows'.
    """
    members = (
        list(dist.get_process_group_ranks(group)) if group is not None else list(range(dist.get_world_size()))
    )
    if len(members) != world:
        raise ValueError(f"world: {world} does not match the group's {len(members)} ranks")
    local = members.index(rank)
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, rank_host(), group=group)  # hosts as lab.resources groups them
    link = "intra" if len(set(hosts)) == 1 else "inter"
    # the exchange's pairs (0,1), (2,3), ...: inter only when a pair crosses hosts
    pair_link = "inter" if any(hosts[i] != hosts[i ^ 1] for i in range(world - world % 2)) else "intra"
    base = {"world": world, "link": link, "repeats": repeats, "threads": torch.get_num_threads()}
    rows: list[dict[str, Any]] = []
    if world > 1:
        points = _collective_points(
            local, world, members, group, sizes or DEFAULT_SIZES, collectives, repeats, time_budget
        )
        for (nbytes, name), seconds in points.items():
            on = pair_link if name in ("sendrecv", "send") else link
            rows.append({**base, "link": on, "collective": name, "nbytes": nbytes, "seconds": seconds})
    if compute:
        rows.extend(rank_compute_rows(local, world, group, hosts, base, repeats=max(3, min(repeats, 5))))
    return rows


def _collective_points(
    local: int,
    world: int,
    members: Sequence[int],
    group: Any,
    sizes: Sequence[int],
    collectives: Sequence[str],
    repeats: int,
    time_budget: float,
) -> dict[tuple[int, str], float]:
    """Seconds of each (bytes, collective) point: the mean of its ``repeats`` (each the slowest
    rank's), the first taken size by size, smallest first, the rest round after round over every
    point (``point_schedule``). Once the first round's time, scaled to all ``repeats``, passes
    ``time_budget`` on any rank, the larger sizes are left out (all ranks agree). The progress
    bar moves one tick per point, spread over the rounds."""
    start = time.perf_counter()
    ops: dict[tuple[int, str], Any] = {}
    times: dict[tuple[int, str], list[float]] = {}
    per_tick, done = max(repeats, 1), 0

    def timed(key: tuple[int, str], warmup: int) -> None:
        nonlocal done
        times.setdefault(key, []).extend(time_reps(ops[key], 1, group, warmup=warmup))
        done += 1
        if done % per_tick == 0:
            tick(f"{key[1]} {key[0]} B on {world}")

    for nbytes in sorted(int(n) for n in sizes):
        spent = (time.perf_counter() - start) * (repeats + 1) / 2  # the first round: 2 of repeats + 1
        over = torch.tensor([float(spent > time_budget)])
        dist.all_reduce(over, op=dist.ReduceOp.MAX, group=group)
        if over.item() > 0:
            break
        for name in collectives:
            ops[(nbytes, name)] = _op(name, nbytes, local, members, group)
            timed((nbytes, name), warmup=1)
    for key in point_schedule(list(ops), repeats):
        timed(key, warmup=0)
    return {key: _max_mean(ts, group) for key, ts in times.items()}


def microbench_worlds(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    sizes: Any,
    worlds: list[int],
    budget: float,
    timeout: float,
) -> list[dict[str, Any]]:
    """Form the full group, then measure at every world size in ``worlds`` (sub-groups of ranks 0..k-1).

    Rank 0 returns every row; the others return nothing (rows are already the slowest rank's).
    """
    from datetime import timedelta

    from distlab.allocator import tune_allocator
    from distlab.runtime.process_group import process_group

    tune_allocator()  # compute rows under the allocator settings ranks train with
    store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timedelta(seconds=timeout))
    prefixed = dist.PrefixStore("distlab-calibrate/", store)
    rows: list[dict[str, Any]] = []
    with process_group(prefixed, rank, world, "gloo", timeout, "cpu"):
        for k in worlds:
            group = None if k == world else dist.new_group(list(range(k)))  # every rank joins new_group
            if rank < k:
                rows.extend(
                    microbench_rank(rank, k, group=group, sizes=sizes, time_budget=budget / len(worlds))
                )
            dist.barrier()
        # several hosts: rank 0 and the first rank of another host, alone, send one way (the link's
        # rate: send/inter) and exchange (sendrecv/inter, as gossip does), not shared with other pairs
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, rank_host())
        other = next((i for i, h in enumerate(hosts) if h != hosts[0]), None)
        if other is not None:
            pair = dist.new_group([0, other])
            if rank in (0, other):
                rows.extend(
                    microbench_rank(
                        rank,
                        2,
                        group=pair,
                        sizes=LINK_SIZES,
                        collectives=("send", "sendrecv"),
                        compute=False,
                        time_budget=budget / len(worlds),
                    )
                )
            dist.barrier()
            # the link of rank 0's host shared: 2 and more ranks of other hosts into it, and out of it
            remote = [i for i, h in enumerate(hosts) if h != hosts[0]][:MAX_FLOWS]
            for k in range(2, len(remote) + 1):
                members = [0, *remote[:k]]
                shared = dist.new_group(members)  # every rank joins new_group
                if rank in members:
                    rows.extend(
                        shared_link_rows(
                            rank, members, shared, LINK_SIZES, 3, budget / len(worlds) / len(remote)
                        )
                    )
                dist.barrier()
    return rows if rank == 0 else []
