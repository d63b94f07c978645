"""The typed rows calibration's stages hand to the fits (costmodel/calibrate.py): ``CollectiveRow``
(microbenchmarks), ``LocalStep`` (a model's measured local step: the compute table's rows),
``ComputeFitRow`` (a reference model's local step beside its profile) and ``LoopRun`` (a
training-loop run beside its prediction; its features from ``overhead_features``). Each row's
``to_dict`` is the form calibrations store and cache; ``from_dict`` and ``as_rows`` the one way back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from distlab.errors import CalibrationError

if TYPE_CHECKING:
    from distlab.costmodel.model import CostModel
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec
    from distlab.strategy.types import Strategy

R = TypeVar("R", bound="_Row")


# -- rows ---------------------------------------------------------------------------------
class _Row:
    """The dict form of a row type (what calibrations store) and the one way back from it."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass
    LABEL: ClassVar[str]  # how an error names a list of these rows
    SOURCE: ClassVar[str]  # what makes them, for the error's fix

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any], where: str | None = None) -> R:
        """A row from its dict form: keys it does not know are ignored, optional ones default;
        values are kept as they are, so ``to_dict`` gives the stored dict back."""
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in d]
        if missing:
            raise CalibrationError(f"{where or cls.LABEL}: missing {missing}; rows come from {cls.SOURCE}")
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def as_rows(cls: type[R], rows: Iterable[R | Mapping[str, Any]]) -> list[R]:
    """``rows`` as ``cls``: dicts (a cached calibration, an older caller) converted, an error naming the first
    bad one."""
    return [
        r if isinstance(r, cls) else cls.from_dict(cast(Mapping[str, Any], r), f"{cls.LABEL}[{i}]")
        for i, r in enumerate(rows)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectiveRow(_Row):
    """One microbenchmark (runtime.microbench.microbench_rank returns these as dicts: the runtime
    does not import the cost model). Every rank reports the slowest rank's figure."""

    LABEL: ClassVar[str] = "microbenchmarks"
    SOURCE: ClassVar[str] = "microbench_rank()"

    collective: str
    """allreduce, reduce, broadcast, allgather, sendrecv, send; incast, outcast (one host's link
    shared by concurrent flows); or compute, optimizer (plain SGD), optimizer:momentum,
    optimizer:adam, copy; optimizer_tensor:sgd, optimizer_tensor:momentum, optimizer_tensor:adam
    (seconds per parameter tensor of that update beside its bytes)."""
    world: int
    """Ranks taking part."""
    nbytes: int = 0
    """Message bytes (allgather: contributed per rank; sendrecv: sent and received by each rank at
    once); optimizer: parameter bytes updated; copy: bytes flattened; compute: 0."""
    seconds: float
    """Median over repeats of the slowest rank; compute and optimizer: every rank busy at once."""
    link: str = "intra"
    """intra (one host) or inter."""
    repeats: int | None = None
    threads: int | None = None
    """Threads each rank ran (compute rows: thread efficiency is fitted across them)."""
    alone: float | None = None
    """compute, optimizer, copy: the same work with one rank at a time (median)."""
    contention: float | None = None
    """compute: ``seconds / alone``."""
    flops: float | None = None
    """compute: floating-point operations of the workload."""
    ranks_on_host: int | None = None
    cores: int | None = None
    host: str | None = None
    flows: int | None = None
    """incast, outcast: one-way flows sharing one host's link at once (into it, out of it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalStep(_Row):
    """A model's local step measured on the cluster: a row of the compute table (compute.py)."""

    LABEL: ClassVar[str] = "compute runs"
    SOURCE: ClassVar[str] = "Lab.calibrate(models=...)"

    key: str
    """compute.model_key of the model."""
    ranks: int
    """Ranks on the host, every one of them busy."""
    cores: int | None = None
    """The host's cores."""
    batch: int
    """Per-replica batch."""
    seconds: float
    """Median over steps of each step's slowest rank."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeFitRow(_Row):
    """A reference model's local step beside its profile: what ``fit_compute`` fits."""

    LABEL: ClassVar[str] = "local steps"
    SOURCE: ClassVar[str] = "Lab.calibrate()"

    measured: float
    """The local step (``LocalStep.seconds``)."""
    profiled: float
    """The profile's forward + backward seconds at that batch."""
    tensors: int
    """Trainable tensors."""
    ranks_on_host: int | None = None
    cores: int | None = None
    profile_threads: int | None = None
    """Threads the profile ran."""
    thread_efficiency: float | None = None
    """The profile's own thread scaling (``meta["thread_efficiency"]``), if it measured one."""

    @classmethod
    def of(cls, step: LocalStep, profile: ModelProfile) -> ComputeFitRow:
        """``step`` beside ``profile``, the model's profile."""
        return cls(
            measured=step.seconds,
            profiled=profile.compute_time_at(step.batch),
            tensors=len(profile.variables),
            ranks_on_host=step.ranks,
            cores=step.cores,
            profile_threads=profile.meta.get("threads"),
            thread_efficiency=profile.meta.get("thread_efficiency"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopRun(_Row):
    """A training-loop run of a reference model beside its prediction: what ``fit_overhead`` fits.
    Every field but ``measured`` comes from ``overhead_features``."""

    LABEL: ClassVar[str] = "overhead runs"
    SOURCE: ClassVar[str] = "Lab.calibrate()"

    world: int
    builder: str | None = None
    tensors: int
    """Trainable tensors."""
    calls: float = 0.0
    """Collective calls per step."""
    gather_calls: int = 0
    """Of those, the calls that gather sparse rows (the all-gather path's, the PS path's to its servers)."""
    sparse_units: int = 0
    """Sparse variables or shards."""
    ps_units: int = 0
    """Dense variables or shards on the PS path."""
    gossip_bytes: float = 0.0
    """Bytes gossiped per step, times the in-degree."""
    gossip_tensors: float = 0.0
    """Tensors gossiped per step, times the in-degree."""
    measured: float
    """Seconds a step, as a run's throughput times it."""
    predicted: float
    """Seconds a step predicted without the terms fitted here, compute from the model's local step."""
    compute: float = 0.0
    comm: float = 0.0
    """Predicted communication on the wire, exposed."""
    comm_alpha: float = 0.0
    """The part of ``comm`` that latencies make (``comm`` predicted with every beta at 0)."""
    hidden: float = 0.0
    """Predicted backward-task seconds hidden behind backward (what ``overlap_loss`` prices)."""
    ranks_on_host: int | None = None
    cores: int | None = None


def overhead_features(
    cm: CostModel, profile: ModelProfile, resources: ResourceSpec, strategy: Strategy
) -> dict[str, Any]:
    """Every ``LoopRun`` field but ``measured`` for ``strategy`` on ``profile`` at ``resources``
    (the run's own ranks), as ``cm`` compiles and predicts it."""
    host = resources.ranks[0].host
    ab = cm.params.alpha_beta
    latency_only = cm.with_params(cm.params.with_(alpha_beta={k: (a, 0.0) for k, (a, _) in ab.items()}))
    c = cm.compile(profile, strategy)
    # the reference runs step with the runtime's own default optimizer, plain SGD
    pred = cm.predict(profile, resources, strategy, optimizer="sgd")
    lat = latency_only.predict(profile, resources, strategy, optimizer="sgd")
    return {
        "world": resources.world,
        "builder": strategy.builder,
        "tensors": len(profile.variables),
        "calls": c.n_calls,
        "gather_calls": c.ag_calls + c.sps_gather_calls,  # the sparse paths' gathers
        "sparse_units": c.sparse_units,
        "ps_units": c.ps_units,
        "gossip_bytes": c.gossip_bytes * c.gossip_degree,
        "gossip_tensors": c.gossip_tensors * c.gossip_degree,
        "predicted": pred.step_time,
        "compute": pred.breakdown["compute"],
        "comm": pred.breakdown["comm"] - pred.detail["calls"],  # on the wire, exposed
        "comm_alpha": lat.breakdown["comm"] - lat.detail["calls"],  # of which latencies
        "hidden": pred.detail["hidden"],
        "ranks_on_host": len(resources.ranks_on(host)),
        "cores": resources.cores.get(host),
    }
