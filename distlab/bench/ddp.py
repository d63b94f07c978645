"""Timing bodies for the runtime benchmarks: a plain DDP loop and run_rank, interleaved inside one spawned
group."""

from __future__ import annotations

import time
from typing import Any

import torch

from distlab.runtime.data import RankBatches
from distlab.runtime.job import RankJob, RunOptions
from distlab.strategy.types import Strategy


def _model_and_data(model_name: str, model_opts: dict[str, Any], n: int) -> tuple[torch.nn.Module, Any]:
    from distlab import data, zoo

    model = zoo.get(model_name, seed=0, **model_opts)
    return model, data.synthetic(model, n=n, seed=0)


def ddp_loop(
    model: torch.nn.Module, dataset: Any, rank: int, world: int, batch: int, steps: int, warmup: int
) -> dict[str, float]:
    """Plain ``DistributedDataParallel`` training (SGD lr 0.01, cross-entropy): samples/s after warm-up."""
    from torch.nn.parallel import DistributedDataParallel

    from distlab.runtime.trainer import default_loss

    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    batches = RankBatches(dataset, batch, rank, world, True, 0)
    G = batch * world
    t0 = 0.0
    for step in range(steps):
        if step == warmup:
            t0 = time.perf_counter()
        x, y = batches.get(step * G)
        opt.zero_grad(set_to_none=True)
        default_loss(ddp(x), y).backward()
        opt.step()
    elapsed = time.perf_counter() - t0
    return {"samples_per_s": G * (steps - warmup) / elapsed, "step_time": elapsed / (steps - warmup)}


def distlab_run(job: RankJob, warmup: int) -> dict[str, float]:
    """``run_rank`` on ``job``: samples/s and median communication time after warm-up."""
    from distlab.runtime.trainer import run_rank

    recs = run_rank(job)["records"][warmup:]
    G = (job.batch_size or job.strategy.batch.per_replica) * job.world
    elapsed = recs[-1]["wall_time"] - recs[0]["wall_time"] + recs[0]["step_time"]
    comm = sorted(r["comm_time"] for r in recs)
    return {
        "samples_per_s": G * len(recs) / elapsed,
        "step_time": elapsed / len(recs),
        "comm_time": comm[len(comm) // 2],
    }


def interleaved_body(
    rank: int,
    world: int,
    addr: str,
    port: int,
    model_name: str,
    model_opts: dict[str, Any],
    programs: dict[str, Strategy | None],
    batch: int,
    steps: int,
    warmup: int,
    repeats: int,
    options: dict[str, dict[str, Any]] | None = None,
) -> dict[str, list[dict[str, float]]]:
    """Run every program once per round, alternating the order each round (``distlab.bench.interleave``).

    A program is a ``Strategy`` (run through ``run_rank``) or ``None`` (the plain DDP loop).
    Every rank returns its own figures; rank 0's are the ones to report. ``options`` maps a
    program's name to its ``RunOptions`` fields (``{"distlab_ddp_path": {"ddp": True}}``).
    """
    import copy

    base, dataset = _model_and_data(model_name, model_opts, n=max(4096, batch * world * steps))
    names = list(programs)
    out: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for i in range(repeats):
        for name in names if i % 2 == 0 else list(reversed(names)):
            model = copy.deepcopy(base)
            strategy = programs[name]
            if strategy is None:
                group = (addr, port, f"ddp-{i}/")
                out[name].append(
                    _in_group(group, rank, world, ddp_loop, model, dataset, rank, world, batch, steps, warmup)
                )
            else:
                job = RankJob(
                    rank=rank,
                    world=world,
                    master_addr=addr,
                    master_port=port,
                    strategy=strategy,
                    model=model,
                    steps=steps,
                    data=dataset,
                    batch_size=batch,
                    run_id=f"{name}-{i}",
                    timeout=120.0,
                    options=RunOptions(**(options or {}).get(name, {})),
                )
                out[name].append(distlab_run(job, warmup))
    return out


def ddp_only_body(
    rank: int,
    world: int,
    addr: str,
    port: int,
    model_name: str,
    model_opts: dict[str, Any],
    batch: int,
    steps: int,
    warmup: int,
) -> dict[str, float]:
    """(spawned) Plain DDP as a user would start it with ``mp.spawn``: a gloo group, one thread per
    rank (as the Lab gives each rank of a 2-core host), SGD; samples/s after ``warmup`` steps."""
    torch.set_num_threads(1)
    model, dataset = _model_and_data(model_name, model_opts, n=max(4096, batch * world * steps))
    return _in_group(
        (addr, port, "ddp/"), rank, world, ddp_loop, model, dataset, rank, world, batch, steps, warmup
    )


def _in_group(group: tuple[str, int, str], rank: int, world: int, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` inside a gloo default group on the store at ``(addr, port)`` under ``prefix``."""
    import torch.distributed as dist

    addr, port, prefix = group
    store = dist.PrefixStore(prefix, dist.TCPStore(addr, port, world, False))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        return fn(*args)
    finally:
        dist.destroy_process_group()


# steps after a checkpoint that checkpoint_share counts: its writer's CPU (1.5 s for 420 MB here)
# shares the cores with the ranks through about two of the 420 MB MLP's 1.2 s steps
CHECKPOINT_WINDOW = 5


def run_span_throughput(run: Any, warmup: int) -> float:
    """A Lab run's samples/s measured as ``ddp_loop`` measures DDP's: rank 0's wall time from the
    end of its ``warmup``-th step to the end of its last, over the samples of those steps."""
    df = run.metrics
    r0 = df[df["rank"] == 0].sort_values("step")
    ends = r0["wall_time"].to_numpy()
    samples = r0["samples"].to_numpy()
    return float((samples[-1] - samples[warmup - 1]) / (ends[-1] - ends[warmup - 1]))


def checkpoint_share(run: Any, warmup: int, window: int = CHECKPOINT_WINDOW) -> float | None:
    """The share of rank 0's measured span (as ``run_span_throughput`` times it) that the run's last
    checkpoint added (None: it took none inside the span): the steps from the one before it through
    ``window`` after it, each against the span's median step. The snapshot lands in one step and
    the writer's CPU, beside the ranks on the same cores, in the next few. Measured within one run,
    this resolves a cost far below the spread between two runs' throughputs (5% from round to round
    for the 420 MB MLP here)."""
    import statistics

    if not run.last_checkpoint:
        return None
    df = run.metrics
    r0 = df[df["rank"] == 0].sort_values("step")
    steps, ends = r0["step"].to_numpy(), r0["wall_time"].to_numpy()
    took = {int(s): float(b - a) for s, a, b in zip(steps[warmup:], ends[warmup - 1 : -1], ends[warmup:])}
    at = int(run.last_checkpoint["step"])  # steps done before it: its snapshot is in step `at`'s time
    if at not in took:
        return None
    typical = statistics.median(took.values())
    added = sum(took[s] - typical for s in range(at - 1, at + window + 1) if s in took)
    return added / float(ends[-1] - ends[warmup - 1])
