"""RankJob: everything one rank needs to train under a strategy (the launcher -> runtime contract),
and RunOptions: how the runtime runs it beyond the strategy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from distlab.errors import LaunchError, check_positive
from distlab.strategy.execution import BUCKET_BYTES
from distlab.strategy.types import Strategy

SPARSE_EXCHANGES = ("packed", "per_table")


@dataclass(frozen=True)
class RunOptions:
    """How the runtime runs a job, beyond its strategy (the Lab's routes fill it; the defaults are
    the runtime's own when a job is built by hand)."""

    ddp: bool = False
    """Run a pure all-reduce strategy with torch's DDP reducer instead of distlab's buckets
    (strategy/execution.py; the cost model prices it). A DDP-wrapped group stays open after a
    failure, so its peers then wait for the job's ``timeout``."""

    bucket_bytes: int = BUCKET_BYTES
    """The cap of one all-reduce bucket, in bytes (strategy/execution.py's, 4 MiB: DDP's
    ``bucket_cap_mb`` in bytes)."""

    noise_scale: bool = False
    """Measure the gradient noise scale (runtime/noise.py), as an adaptive or AdaScale run does
    anyway; each step's record gains its estimate."""

    adaptive: dict[str, Any] | None = None
    """The goodput controller's table, ``{"table": [[per_replica, accumulation, seconds], ...]}``
    (runs/adaptive.py): the batch is re-chosen at epoch boundaries. None: a fixed batch."""

    base_batch: int | None = None
    """The per-replica batch the learning rate was set for (adaptive/scaling.py); None: the job's
    ``batch_size``."""

    progress: float = 0.0
    """Scale-invariant samples already trained (an adaptive run resumed after a restart)."""

    metrics: tuple[Any, ...] = ()
    """``distlab.step_metrics.StepMetric``s: each step's record gains a column per metric,
    measured on the rank's batch before the update."""

    trace: bool = False
    """Record each rank's timeline of compute and communication (runtime/trace.py)."""

    sparse_exchange: str = "packed"
    """How sparse gradients travel: ``"packed"`` (every table in one exchange) or
    ``"per_table"``."""

    slowdown: tuple[tuple[int, float], ...] = ()
    """``(rank, factor)`` pairs: that rank's forward and backward take ``factor`` times as long (a
    straggler a user asks for; runtime/trainer.py waits the difference before backward). Each
    step's record gains ``delay``, the seconds it waited."""

    jitter: float = 0.0
    """Step-to-step variation asked for: before each backward every rank also waits ``jitter``
    times its compute times a draw of an exponential of mean 1 (so its compute varies with a
    standard deviation of ``jitter`` times its forward and backward, and grows by as much on average), from a
    generator seeded by the run's seed and the rank. 0: none."""

    def __post_init__(self) -> None:
        check_positive("RunOptions.bucket_bytes", self.bucket_bytes, LaunchError)
        check_positive("RunOptions.base_batch", self.base_batch, LaunchError, optional=True)
        if self.sparse_exchange not in SPARSE_EXCHANGES:
            raise LaunchError(
                f"RunOptions.sparse_exchange: {self.sparse_exchange!r}; expected 'packed' (the default) or "
                "'per_table'"
            )
        if self.adaptive is not None and not isinstance(self.adaptive.get("table"), list):
            raise LaunchError("RunOptions.adaptive: {'table': [[per_replica, accumulation, seconds], ...]}")
        object.__setattr__(self, "metrics", tuple(self.metrics))


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
    (adaptive/scaling.py; the base batch is ``batch_size`` unless ``options.base_batch``).
    ``sample_offset`` is the data position (global samples already seen) at step ``start_step``:
    step t reads ``[sample_offset + (t - start_step)*G, ... + G)``, so an elastic resume on a
    new world keeps its position in samples (pass the checkpoint's ``samples``). Positions
    wrap around the dataset; with ``shuffle=True`` epoch e is read through
    ``randperm(len(data), seed + e)``, the same on every rank.

    ``topology`` optionally overrides ``distlab.topology.get(strategy.gossip.topology, world)``
    for gossip (an object with ``.weights``, ``.in_neighbors(r)``, ``.out_neighbors(r)`` and,
    when dynamic, ``.at(step)``). ``options``: how the runtime runs it (``RunOptions``).
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
    # a synchronous run's checkpoints after the first: at most this share of its time (runtime/cut.py)
    checkpoint_budget: float | None = None
    resume_from: str | None = None  # checkpoint file to restore before step start_step
    timeout: float = 60.0  # seconds, for init and for every collective
    threads: int | None = None  # torch intra-op threads in this rank (Dask forces 1)
    device: str = "cpu"  # "cpu" or "cuda:N"
    run_id: str = ""
    options: RunOptions = field(default_factory=lambda: RunOptions())
    topology: Any = None  # gossip topology object; default: distlab.topology.get(...)
    # the user's own loop, ``train(ctx)`` (Lab.run; runtime/own_loop.py); None: the built-in loop
    # over ``data`` (``model``: what the run planned for; each rank prepares its own)
    train_fn: Callable[[Any], Any] | None = None

    @classmethod
    def unplaced(cls, strategy: Strategy, model: Any, steps: int, data: Any, **fields: Any) -> RankJob:
        """A run's job before its ranks are placed: rank 0 of ``strategy.world`` and no rendezvous
        yet (each rank's task fills in its rank, the world it joins and the store's address)."""
        return cls(
            rank=0,
            world=strategy.world,
            master_addr="",
            master_port=0,
            strategy=strategy,
            model=model,
            steps=steps,
            data=data,
            **fields,
        )


# What run_rank reports per step through ``emit``: one dict with these keys first, then ``compute``
# (the step's forward and backward seconds, runtime/straggler.py) and the keys its options add.
# samples: the data position after the step (global samples seen so far, sample_offset included);
# step_time: seconds for the whole step on this rank; comm_time: seconds of it spent waiting on
# communication (what backward did not hide, plus the sync after it); wall_time: time.time().
STEP_RECORD_KEYS = ("run_id", "step", "rank", "loss", "samples", "step_time", "comm_time", "wall_time")
