"""The same training job started without Dask (``runtime.spawn_local``): the launch-overhead baseline."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from distlab.runs import metrics


def job_for_rank(rank: int, world: int, master_addr: str, master_port: int, payload: bytes) -> Any:
    """(spawned child) The pickled RankJob for this rank; ``spawn_local`` then runs ``run_rank`` on it."""
    import cloudpickle

    return dataclasses.replace(
        cloudpickle.loads(payload), rank=rank, world=world, master_addr=master_addr, master_port=master_port
    )


def spawn_run(job: Any, world: int, threads: int | None = None, timeout: float = 300.0) -> dict[str, Any]:
    """Run ``job`` on ``world`` fresh local processes; its records, throughput, wall time and start (epoch
    seconds).

    Throughput is measured exactly as ``Run.throughput`` (``metrics.throughput``), so the two
    launch paths are compared on one definition.
    """
    import cloudpickle

    from distlab.runtime.spawn import spawn_local

    job = dataclasses.replace(job, world=world, threads=threads, checkpoint_dir=None, checkpoint_every=None)
    t0, wall0 = time.perf_counter(), time.time()
    outs = spawn_local(world, job_for_rank, cloudpickle.dumps(job), timeout=timeout, threads=threads)
    wall = time.perf_counter() - t0
    records = [{**r, "restart": 0, "world": world} for o in outs for r in o["records"]]
    df = metrics.frame(records)
    return {"records": df, "throughput": metrics.throughput(df), "wall": wall, "start_wall": wall0}
