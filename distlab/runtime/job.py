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
    ``G = batch_size * world``; rank r reads its contiguous ``batch_size`` slice of it.
    ``sample_offset`` shifts the data position (elastic resume keeps the position in samples).
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


# What run_rank reports per step through ``emit``: one dict with these keys.
STEP_RECORD_KEYS = ("run_id", "step", "rank", "loss", "samples", "step_time", "comm_time", "wall_time")
