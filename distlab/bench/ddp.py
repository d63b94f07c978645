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


def run_span_throughput(run: Any, warmup: int) -> float:
    """A Lab run's samples/s measured as ``ddp_loop`` measures DDP's: rank 0's wall time from the
    end of its ``warmup``-th step to the end of its last, over the samples of those steps."""
    df = run.metrics
    r0 = df[df["rank"] == 0].sort_values("step")
    ends = r0["wall_time"].to_numpy()
    samples = r0["samples"].to_numpy()
    return float((samples[-1] - samples[warmup - 1]) / (ends[-1] - ends[warmup - 1]))
