"""Rank-side microbenchmarks that calibration runs: collectives over message sizes, compute under contention.

``microbench_rank`` runs inside an already initialised ``torch.distributed`` process group (or
sub-group) on every member rank; every rank returns the same rows, because each measurement is
reduced with MAX across ranks (a collective is as slow as its slowest rank). The rows feed
``CostModel.from_microbenchmarks``; their schema is ``costmodel.rows.CollectiveRow`` (dicts
here: the runtime does not import the cost model). Whole training steps are measured by
loopbench.py.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from distlab.resources import available_cores
from distlab.runtime.process_group import rank_host
from distlab.runtime.progress import tick

# buckets are <= 4 MiB; larger messages (a big variable to its server) follow the fitted beta
DEFAULT_SIZES = (4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20)
# the link between two hosts, measured alone: messages well past a shaped link's burst and TCP's
# start-up, so the fit's bytes term is the link's rate (small ones measured the burst)
LINK_SIZES = (1 << 20, 4 << 20, 16 << 20)
MAX_FLOWS = 3  # concurrent flows into (and out of) one host's link measured: 2 .. MAX_FLOWS
COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "sendrecv")
# optimizers timed beside plain SGD (their cost per byte relative to it: CostParams.optimizer_work)
OPTIMIZER_KINDS = ("momentum", "adam")
GEMM_N, GEMM_ITERS = 256, 12  # fixed compute workload: 12 GEMMs of 256x256 (0.4 GFLOP)
OPT_NUMEL = 1 << 21  # 8 MiB of float32 parameters for the optimizer-update row
COPY_NUMEL, COPY_PARTS = 1 << 19, 4  # 2 MiB gathered from 4 tensors: a bucket's flatten (torch.cat)
# Each optimizer and copy repeat first reads a buffer larger than a server's last-level cache: in a
# training step the step's other work evicts the bytes these touch once per step, and timed hot
# they come out several times faster (evidence: docs/cost-model.md §History and evidence).
EVICT_NUMEL = 1 << 24  # 64 MiB of float32


def _gemm(a: torch.Tensor, b: torch.Tensor) -> None:
    for _ in range(GEMM_ITERS):
        torch.mm(a, b)


def _optimizer_step(kind: str = "sgd") -> Any:
    """One step over ``OPT_NUMEL`` parameters of the runtime's default optimizer (plain SGD), or of
    SGD with momentum (``"momentum"``: one state tensor) or Adam (``"adam"``: two)."""
    from distlab.runtime.trainer import default_optimizer

    p = torch.nn.Parameter(torch.zeros(OPT_NUMEL))
    p.grad = torch.ones(OPT_NUMEL)
    if kind == "momentum":
        return torch.optim.SGD([p], lr=0.01, momentum=0.9).step
    if kind == "adam":
        return torch.optim.Adam([p], lr=1e-3).step
    return default_optimizer([p]).step


def _copy_step() -> Any:
    """A bucket's flatten as the runtime does it: ``torch.cat`` of ``COPY_PARTS`` gradients."""
    parts = [torch.ones(COPY_NUMEL // COPY_PARTS) for _ in range(COPY_PARTS)]
    return lambda: torch.cat(parts)


def _time_alone(fn: Any, repeats: int, before: Any = None) -> list[float]:
    """Per-repeat seconds of ``fn`` on this rank alone (the others wait at a barrier);
    ``before()``, untimed, ahead of each repeat."""
    out = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _time_reps(fn: Any, repeats: int, group: Any, warmup: int = 1, before: Any = None) -> list[float]:
    """Per-repeat seconds, each started right after a barrier so all ranks begin together
    (``before()``, untimed, ahead of the barrier)."""
    out = []
    for i in range(warmup + repeats):
        if before is not None:
            before()
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return out


def _max_median(times: list[float], group: Any) -> float:
    """Median over repeats of the slowest rank's time (MAX across ranks per repeat)."""
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(statistics.median(t.tolist()))


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
            seconds = _max_median(_time_reps(fn, repeats, group), group)
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
    when None). Sizes run smallest first; once ``time_budget`` seconds have passed on any rank
    the larger sizes are skipped (all ranks agree). Rows: ``collective, world, nbytes, seconds,
    link, repeats`` (sendrecv: a pairwise exchange, each rank sending and receiving ``nbytes`` at
    once as a gossip step does; allgather: bytes contributed per rank), then a
    ``compute`` row (``seconds`` all busy, ``alone``, ``contention``, ``threads``, ``flops``,
    ``ranks_on_host``, ``cores``), an ``optimizer`` row (seconds per step of the runtime's
    default optimizer over ``nbytes`` parameter bytes: ``seconds`` all ranks busy, ``alone`` one
    rank at a time; the cost model applies its own contention to the latter) and a ``copy`` row
    (a bucket's flatten of ``nbytes``, one rank at a time); both of the last with their bytes
    out of cache, as in a training step.
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
    start = time.perf_counter()
    if world > 1:
        for nbytes in sorted(sizes or DEFAULT_SIZES):
            over = torch.tensor([float(time.perf_counter() - start > time_budget)])
            dist.all_reduce(over, op=dist.ReduceOp.MAX, group=group)
            if over.item() > 0:
                break
            for name in collectives:
                fn = _op(name, int(nbytes), local, members, group)
                seconds = _max_median(_time_reps(fn, repeats, group), group)
                tick(f"{name} {nbytes} B on {world}")
                on = pair_link if name in ("sendrecv", "send") else link
                rows.append(
                    {**base, "link": on, "collective": name, "nbytes": int(nbytes), "seconds": seconds}
                )
    if compute:
        rows.extend(_compute_rows(local, world, group, hosts, base, repeats=max(3, min(repeats, 5))))
    return rows


def _compute_rows(
    local: int, world: int, group: Any, hosts: list[Any], base: dict[str, Any], repeats: int
) -> list[dict[str, Any]]:
    """GEMM time with this rank alone (others wait at a barrier) and with every rank busy at once."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(GEMM_N, GEMM_N, generator=g)
    b = torch.randn(GEMM_N, GEMM_N, generator=g)
    evict = torch.ones(EVICT_NUMEL)
    step, copy = _optimizer_step(), _copy_step()
    kinds = {k: _optimizer_step(k) for k in OPTIMIZER_KINDS}

    def cold() -> None:  # the optimizer's and the copy's bytes out of cache, as in a training step
        evict.sum()

    _gemm(a, b)  # warm-up
    step()
    copy()
    for fn in kinds.values():
        fn()  # creates the state tensors
    alone = opt_alone = copy_alone = 0.0
    kind_alone = dict.fromkeys(kinds, 0.0)
    for turn in range(world):
        dist.barrier(group=group)
        if turn == local:
            alone = statistics.median(_time_alone(lambda: _gemm(a, b), repeats))
            opt_alone, copy_alone = (statistics.median(_time_alone(fn, repeats, cold)) for fn in (step, copy))
            for k, fn in kinds.items():
                kind_alone[k] = statistics.median(_time_alone(fn, repeats, cold))
        dist.barrier(group=group)
    busy = statistics.median(_time_reps(lambda: _gemm(a, b), repeats, group, warmup=0))
    opt = statistics.median(_time_reps(step, repeats, group, before=cold))
    t = torch.tensor([alone, busy, opt, opt_alone, copy_alone, *kind_alone.values()], dtype=torch.float64)
    dist.all_reduce(t, group=group)  # mean over ranks
    alone, busy, opt, opt_alone, copy_alone, *per_kind = (t / world).tolist()
    me = hosts[local]
    flops = 2.0 * GEMM_N**3 * GEMM_ITERS
    return [
        {
            **base,
            "collective": "compute",
            "nbytes": 0,
            "seconds": busy,
            "alone": alone,
            "contention": busy / alone if alone > 0 else float("nan"),
            "flops": flops,
            "ranks_on_host": max(hosts.count(h) for h in set(hosts)),
            "cores": available_cores(),
            "host": me,
        },
        {**base, "collective": "optimizer", "nbytes": OPT_NUMEL * 4, "seconds": opt, "alone": opt_alone},
        {**base, "collective": "copy", "nbytes": COPY_NUMEL * 4, "seconds": copy_alone, "alone": copy_alone},
        *(
            {**base, "collective": f"optimizer:{k}", "nbytes": OPT_NUMEL * 4, "seconds": s, "alone": s}
            for k, s in zip(kinds, per_kind)
        ),
    ]


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
