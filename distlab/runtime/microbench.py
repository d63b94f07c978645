"""Rank-side microbenchmarks that calibration runs: collectives over message sizes, compute under contention.

``microbench_rank`` runs inside an already initialised ``torch.distributed`` process group (or
sub-group) on every member rank; every rank returns the same rows, because each measurement is
reduced with MAX across ranks (a collective is as slow as its slowest rank). The rows feed
``CostModel.from_microbenchmarks``; their schema is ``costmodel.calibrate.CollectiveRow`` (dicts
here: the runtime does not import the cost model). ``overhead_rank`` runs the real training loop
on ``LoopCase``s for the training-loop stage, ``loop_pass_rank`` a pass of ``LocalCase``s' local
steps (and of that stage) at one world size. How many passes and how long each lasts is the
caller's choice (``launch/calibrate.py``); the defaults here are the reference models'.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

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
COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "sendrecv")
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


def _optimizer_step() -> Any:
    """One step of the runtime's default optimizer (plain SGD) over ``OPT_NUMEL`` parameters."""
    from distlab.runtime.trainer import default_optimizer

    p = torch.nn.Parameter(torch.zeros(OPT_NUMEL))
    p.grad = torch.ones(OPT_NUMEL)
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
                rows.append({**base, "link": on, "collective": name, "nbytes": int(nbytes), "seconds": seconds})
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

    def cold() -> None:  # the optimizer's and the copy's bytes out of cache, as in a training step
        evict.sum()

    _gemm(a, b)  # warm-up
    step()
    copy()
    alone = opt_alone = copy_alone = 0.0
    for turn in range(world):
        dist.barrier(group=group)
        if turn == local:
            alone = statistics.median(_time_alone(lambda: _gemm(a, b), repeats))
            opt_alone, copy_alone = (statistics.median(_time_alone(fn, repeats, cold)) for fn in (step, copy))
        dist.barrier(group=group)
    busy = statistics.median(_time_reps(lambda: _gemm(a, b), repeats, group, warmup=0))
    opt = statistics.median(_time_reps(step, repeats, group, before=cold))
    t = torch.tensor([alone, busy, opt, opt_alone, copy_alone], dtype=torch.float64)
    dist.all_reduce(t, group=group)  # mean over ranks
    alone, busy, opt, opt_alone, copy_alone = (t / world).tolist()
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

    from distlab.runtime.allocator import tune_allocator
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
                        rank, 2, group=pair, sizes=LINK_SIZES, collectives=("send", "sendrecv"), compute=False,
                        time_budget=budget / len(worlds),
                    )
                )
            dist.barrier()
    return rows if rank == 0 else []


class LoopCase(NamedTuple):
    """A training-loop case: ``model`` under ``strategy`` on ``data`` at per-replica ``batch``,
    ``steps`` steps a pass, ``passes`` passes."""

    model: Any
    strategy: Any
    data: Any
    batch: int
    steps: int
    passes: int


class LocalCase(NamedTuple):
    """A model whose local step is measured: ``model`` on ``data`` at per-replica ``batch``,
    trained on ``loss`` (None: the runtime's default loss)."""

    model: Any
    data: Any
    batch: int
    loss: Any = None


def overhead_rank(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    cases: Sequence[LoopCase | tuple[Any, ...]],
    timeout: float,
) -> list[list[float]]:
    """(worker) The real training loop (``run_rank``) on each ``LoopCase``, ``passes`` times: the
    cases in turn, pass after pass, so a case's passes lie apart in time and a slow moment of the
    machine hits one of them.

    Returns this rank's seconds per step per case (from one step's end to the next, as a run's
    throughput is timed), every step of every pass but each pass's first third (warm-up): what
    the cost model sees of hooks, bucket copies, per-tensor dispatch, data and Python beyond the
    arithmetic. Every rank returns as many steps per case, in the same order, so the caller can
    take each step's slowest rank and then the median over steps (``launch.metrics.slowest_median``),
    pooling the steps of several calls made at other moments.
    """
    loops = [LoopCase(*c) for c in cases]
    times: list[list[float]] = [[] for _ in loops]
    for p in range(max((c.passes for c in loops), default=0)):
        for i, case in enumerate(loops):
            if p < case.passes:
                times[i].extend(_overhead_pass(rank, world, master_addr, master_port, case, f"{i}-{p}", timeout))
                tick(f"training loop case {i + 1} of {len(loops)}")
    return times


def _overhead_pass(
    rank: int, world: int, master_addr: str, master_port: int, case: LoopCase, tag: str, timeout: float
) -> list[float]:
    """One pass of an overhead case: each step's seconds from the end of the step before to its
    own (what ``launch.metrics.throughput`` times of a run), the first third (warm-up) excluded."""
    from distlab.runtime.job import RankJob
    from distlab.runtime.trainer import run_rank

    job = RankJob(
        rank=rank,
        world=world,
        master_addr=master_addr,
        master_port=master_port,
        strategy=case.strategy,
        model=case.model,
        steps=case.steps,
        data=case.data,
        batch_size=case.batch,
        shuffle=True,  # as lab.launch runs by default
        run_id=f"distlab-overhead-{tag}",
        timeout=timeout,
    )
    ends = [r["wall_time"] for r in run_rank(job)["records"]]
    skip = max(1, len(ends) // 3)
    return [b - a for a, b in zip(ends[skip - 1 :], ends[skip:])]


LOCAL_WARMUP, LOCAL_STEPS = 2, 8
LOCAL_MAX_STEPS = 60  # the cap on steps when a pass is given seconds to fill with short steps


def loop_pass_rank(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    local: Sequence[LocalCase | tuple[Any, ...]],
    threads: list[int],
    cases: Sequence[LoopCase | tuple[Any, ...]],
    timeout: float,
    seconds: float = 0.0,
    max_steps: int = LOCAL_MAX_STEPS,
) -> tuple[list[list[float]], list[list[float]]]:
    """(worker) One pass at this world size: each ``LocalCase``'s own step with every rank busy,
    then the training loop on each ``LoopCase`` (``overhead_rank``).

    The local step is the training loop (``run_rank``) less the strategy: read the batch, zero
    the gradients, forward, loss, backward, read the loss; no optimizer step (the cost model has
    its own term). Every rank takes it at once, at the threads a run of this world size gives it
    (``threads[rank]``), and the ranks step in lockstep (after each step one 4-byte all-reduce
    agrees whether to go on), because a synchronous run's step waits for its slowest rank and
    free-running ranks never wait. ``LOCAL_STEPS`` steps each, more up to ``seconds`` in all (and
    at most ``max_steps``) when steps are short. One world size a call, as a run of that many
    ranks is; the local steps beside the loop, because calibration fits the loop's cost as its
    step less the local step of the same moment (evidence: docs/cost-model.md §History and
    evidence).

    Returns (this rank's local-step seconds per ``local`` case, its seconds per step per case):
    every timed step, aligned by step across ranks, for the caller to pool over passes and take
    the median of each step's slowest rank, as a run's throughput does
    (``launch.metrics.slowest_median``).
    """
    from datetime import timedelta

    from distlab.runtime.allocator import tune_allocator
    from distlab.runtime.process_group import process_group

    tune_allocator()
    own: list[list[float]] = []
    if local:
        torch.set_num_threads(int(threads[rank]))
        store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timedelta(seconds=timeout))
        with process_group(dist.PrefixStore("distlab-local-step/", store), rank, world, "gloo", timeout, "cpu"):
            lockstep = dist.group.WORLD if world > 1 else None
            for case in (LocalCase(*c) for c in local):
                case.model.train()
                dist.barrier()
                own.append(
                    _time_local(
                        case.model, case.data, case.batch, rank, world, LOCAL_STEPS, lockstep, seconds, max_steps,
                        case.loss,
                    )
                )
                tick(f"local step of {type(case.model).__name__}")
            dist.barrier()
    return own, overhead_rank(rank, world, master_addr, master_port, cases, timeout)


def _time_local(
    model: Any,
    data: Any,
    batch: int,
    rank: int,
    k: int,
    steps: int,
    lockstep: Any = None,
    seconds: float = 0.0,
    max_steps: int = LOCAL_MAX_STEPS,
    loss: Any = None,
) -> list[float]:
    """Wall-clock seconds of each local step, at least ``steps`` of them (more, up to
    ``seconds`` in all and ``max_steps`` steps, when steps are short). ``lockstep``: the group
    of the ``k`` ranks, which agree after every step whether to go on, so a step lasts until
    the slowest rank has taken it, as in a synchronous run (a rank descheduled while ranks
    outnumber cores delays the step it falls in for all)."""
    from distlab.runtime.data import RankBatches
    from distlab.runtime.trainer import default_loss

    step = _local_step(model, RankBatches(data, batch, rank, k, False, 0), loss or default_loss)
    for i in range(LOCAL_WARMUP):
        step(i * batch * k)
    vote = torch.zeros(1)
    times: list[float] = []
    more, t0 = True, time.perf_counter()
    end = t0 + seconds
    while more:
        step((LOCAL_WARMUP + len(times)) * batch * k)
        n = len(times) + 1
        more = n < steps or (time.perf_counter() < end and n < max_steps)
        if lockstep is not None:  # go on while any rank wants to: every rank takes as many steps
            vote[0] = float(more)
            dist.all_reduce(vote, op=dist.ReduceOp.MAX, group=lockstep)
            more = bool(vote.item() > 0)
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    return times


def _local_step(model: Any, batches: Any, loss_fn: Any) -> Any:
    """One step of ``model`` at data position ``pos``: the training loop less synchronisation and optimizer."""
    from distlab.runtime.data import call_model

    params = [p for p in model.parameters() if p.requires_grad]

    def step(pos: int) -> None:
        x, y = batches.get(pos)
        for p in params:
            p.grad = None
        loss = loss_fn(call_model(model, x), y)
        loss.backward()
        float(loss.detach())

    return step
