"""RankJob: everything one rank needs to train under a strategy (the launcher -> runtime contract)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from distlab.strategy.types import Strategy


@dataclass
class RankJob:
    """One rank's share of a run. Travels to the worker by cloudpickle.

    The rendezvous store lives at ``master_addr:master_port`` (a ``TCPStore`` server someone
    else opened on an OS-chosen port); ``run_rank`` connects to it as a client unless a
    ``store`` object is passed to it directly.

    ``data`` is a map-style torch ``Dataset`` of ``(input, target)`` pairs. The global batch
    of step t (with ``shuffle=False``) is samples ``[t*G, (t+1)*G)`` with
    ``G = batch_size * accumulation * world``; rank r reads its ``accumulation`` contiguous
    micro-batches of ``batch_size`` (runtime/data.py), and syncs its gradients once, after the
    last. The optimizer's rate is scaled by ``strategy.batch.lr_scaling`` around each step
    (adaptive/scaling.py; the base batch is ``batch_size`` unless ``extra["base_batch"]``).
    ``sample_offset`` is the data position (global samples already seen) at step ``start_step``:
    step t reads ``[sample_offset + (t - start_step)*G, ... + G)``, so an elastic resume on a
    new world keeps its position in samples (pass the checkpoint's ``samples``). Positions
    wrap around the dataset; with ``shuffle=True`` epoch e is read through
    ``randperm(len(data), seed + e)``, the same on every rank.

    ``topology`` optionally overrides ``distlab.topology.get(strategy.gossip.topology, world)``
    for gossip (an object with ``.weights``, ``.in_neighbors(r)``, ``.out_neighbors(r)`` and,
    when dynamic, ``.at(step)``). ``extra`` keys the runtime reads: ``ddp`` (default False; True
    runs a pure all-reduce strategy with torch's DDP reducer instead of distlab's buckets; note
    that a DDP-wrapped group stays open after a failure, so peers then wait for ``timeout``),
    ``bucket_bytes`` (all-reduce bucket cap, default 4 MiB), ``noise_scale`` (True: measure the
    gradient noise scale, as AdaScale does anyway; runtime/noise.py), ``adaptive`` (the goodput
    controller's table ``{"table": [[per_replica, accumulation, seconds], ...]}``: the batch is
    re-chosen at epoch boundaries), ``base_batch``, ``progress`` (scale-invariant samples so far),
    ``metrics`` (``distlab.step_metrics.StepMetric``s: each step's record gains a column per
    metric, on the rank's batch before the update), ``trace``.
    ``run_id`` must be unique per rendezvous store (it prefixes the store's keys).
    """

    rank: int
    world: int
    master_addr: str
    master_port: int
    strategy: Strategy
    model: Any  # torch.nn.Module, identical initial weights on every rank
    steps: int
    data: Any  # torch.utils.data.Dataset
    loss: Callable[[Any, Any], Any] | None = None  # default: cross-entropy
    optimizer: Callable[[Any], Any] | None = None  # params -> Optimizer; default SGD(lr=0.01)
    batch_size: int | None = None  # per replica; default strategy.batch.per_replica
    shuffle: bool = True
    seed: int = 0
    start_step: int = 0
    sample_offset: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    resume_from: str | None = None  # checkpoint file to restore before step start_step
    timeout: float = 60.0  # seconds, for init and for every collective
    threads: int | None = None  # torch intra-op threads in this rank (Dask forces 1)
    device: str = "cpu"  # "cpu" or "cuda:N"
    run_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    topology: Any = None  # gossip topology object; default: distlab.topology.get(...)


# What run_rank reports per step through ``emit``: one dict with these keys.
# samples: the data position after the step (global samples seen so far, sample_offset included);
# step_time: seconds for the whole step on this rank; comm_time: seconds of it spent waiting on
# communication (what backward did not hide, plus the sync after it); wall_time: time.time().
STEP_RECORD_KEYS = ("run_id", "step", "rank", "loss", "samples", "step_time", "comm_time", "wall_time")
