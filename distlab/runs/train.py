"""The training rank body that runs in each Dask task: a RankJob handed to the runtime, records sent as
events."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from distlab.cluster import spmd

EMIT_INTERVAL = 0.1  # seconds between live-record events from one rank


def _plain(value: Any) -> Any:
    """msgpack-safe scalars (numpy/torch scalars -> Python)."""
    if hasattr(value, "item"):
        return value.item()
    return value


def _device(job: Any, rank: int) -> str:
    """``cuda:0`` for a GPU rank (dask-cuda gives each worker one visible GPU), else the job's device."""
    if job.strategy.ranks[rank].device.startswith("gpu"):
        import torch

        if torch.cuda.is_available():
            return "cuda:0"
    return job.device


def _backend(job: Any) -> str:
    """The strategy's backend, except that ``auto`` is gloo when two ranks of one host share a GPU
    (more workers than GPUs): NCCL refuses two ranks on one device."""
    gpus = [(r.host, r.device) for r in job.strategy.ranks if r.device.startswith("gpu")]
    if job.strategy.backend == "auto" and len(gpus) != len(set(gpus)):
        return "gloo"
    return job.strategy.backend


def train_rank(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    payload: bytes,
    topic: str,
    restart: int,
    run_rank: Any,
) -> dict[str, Any]:
    """(worker) Run one rank of the job; every step record goes to the client as a Dask event on ``topic``.

    The job arrives pickled (``payload``) and is unpickled here, so the model and the process
    group its hooks reference belong to this call alone: when the rank fails, they are freed
    with its frames and the group's sockets close, which makes the peers' collectives fail at
    once. (A job held in the task's arguments would keep the group alive until the task is
    released, and the peers would wait for the collective timeout.)
    """
    import cloudpickle
    from distributed import get_worker

    worker = get_worker()
    job = cloudpickle.loads(payload)
    job = dataclasses.replace(
        job,
        rank=rank,
        world=world,
        master_addr=master_addr,
        master_port=master_port,
        device=_device(job, rank),
        strategy=dataclasses.replace(job.strategy, backend=_backend(job)),
    )
    tag = {"restart": restart, "world": world}
    batch: list[dict[str, Any]] = []
    sent = [0.0]
    lock = threading.Lock()  # the training thread appends, the flusher sends
    done = threading.Event()

    def flush() -> None:
        with lock:  # sent in the order made
            if batch:
                worker.log_event(topic, {"records": list(batch)})
                batch.clear()
            sent[0] = time.monotonic()

    def emit(record: dict[str, Any]) -> None:
        # One event per EMIT_INTERVAL, not per step: each event wakes the worker's event loop,
        # which competes with training for the cores. The first record goes at once (latency).
        with lock:
            batch.append({**{k: _plain(v) for k, v in record.items()}, **tag})
            due = not sent[0] or time.monotonic() - sent[0] >= EMIT_INTERVAL
        if due:
            flush()

    def flusher() -> None:
        # a rank that stalls (slow data, a peer late to a collective) still reports the steps it made
        while not done.wait(EMIT_INTERVAL):
            if time.monotonic() - sent[0] >= EMIT_INTERVAL:
                flush()

    def should_stop() -> bool:
        return spmd.should_stop(job.run_id)

    threading.Thread(target=flusher, name=f"distlab-records-{rank}", daemon=True).start()
    try:
        out = run_rank(job, emit=emit, should_stop=should_stop)
    finally:
        done.set()
        flush()
    for rec in out.get("records") or []:
        rec.update(tag)
    return out
