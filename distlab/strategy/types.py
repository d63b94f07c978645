"""Strategy: an explicit, serialisable, per-variable distribution plan (AutoDist's unified representation)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distlab.resources import RankSpec  # a rank's host and device: a resource fact (re-exported)

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile

SYNC_KINDS = ("allreduce", "ps", "allgather", "gossip")
COMPRESSORS = ("none", "fp16", "bf16")
LR_SCALING = ("none", "linear", "sqrt", "adascale")
GOSSIP_MODES = ("atc", "awc")
# asynchronous gossip (BlueFog's windows, runtime/async_gossip.py): push-sum, or neighbour averaging
ASYNC_GOSSIP_MODES = ("push_sum", "average")
BACKENDS = ("auto", "gloo", "nccl")
# 2: a ps sync carries its consistency (sync, staleness, local_replication); version 1 files read
# as synchronous PS with no staleness
# 3: gossip settings carry ``asynchronous`` (versions 1 and 2 read as synchronous gossip)
STRATEGY_VERSION = 3


@dataclass(frozen=True)
class Sync:
    """How one variable (or shard) is synchronised.

    kind ``allreduce``: ``group`` (bucket id) and ``compressor``; ``ps``: ``server`` (a rank) and
    its consistency, as AutoDist's ``PSSynchronizer`` has it: ``sync`` (False: asynchronous, each
    worker's gradient applied when it arrives), ``staleness`` (s > 0: stale-synchronous, a worker
    at most s steps ahead of the slowest; needs ``sync``), ``local_replication`` (reads go to a
    worker-side copy of the variable, refreshed after the worker's sync);
    ``allgather``: sparse gradients as indices + values; ``gossip``: neighbour averaging.
    """

    kind: str
    group: int | None = None
    compressor: str = "none"
    server: int | None = None
    sync: bool = True
    staleness: int = 0
    local_replication: bool = False

    @property
    def consistency(self) -> tuple[bool, int]:
        """(sync, staleness): (True, 0) synchronous, (True, s) stale-synchronous, (False, 0) asynchronous."""
        return self.sync, self.staleness

    def to_dict(self, version: int = STRATEGY_VERSION) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind}
        if self.kind == "allreduce":
            d["group"] = self.group if self.group is not None else 0
            d["compressor"] = self.compressor
        elif self.kind == "ps":
            d["server"] = self.server
            if version >= 2:
                d.update(sync=self.sync, staleness=self.staleness, local_replication=self.local_replication)
        elif self.compressor != "none":
            d["compressor"] = self.compressor
        return d


def _consistency_columns(s: Sync) -> dict[str, Any]:
    return {"sync": s.sync, "staleness": s.staleness, "local_replication": s.local_replication}


@dataclass(frozen=True)
class Partition:
    """Split a variable along ``axis`` into ``shards`` slices (``numpy.array_split`` sizes)."""

    axis: int
    shards: int

    def sizes(self, dim: int) -> list[int]:
        """Shard sizes along the axis of length ``dim``: the first ``dim % shards`` get one more."""
        q, r = divmod(dim, self.shards)
        return [q + 1 if i < r else q for i in range(self.shards)]

    def to_dict(self) -> dict[str, Any]:
        return {"axis": self.axis, "shards": self.shards}


@dataclass(frozen=True)
class VariablePlan:
    """The plan for one variable: either one ``sync``, or a ``partition`` with one sync per shard."""

    name: str
    sync: Sync | None = None
    partition: Partition | None = None
    shards: tuple[Sync, ...] = ()

    @property
    def syncs(self) -> tuple[Sync, ...]:
        """Every sync of this variable: the one, or one per shard."""
        return self.shards if self.partition is not None else ((self.sync,) if self.sync else ())

    def to_dict(self, version: int = STRATEGY_VERSION) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.partition is not None:
            d["partition"] = self.partition.to_dict()
            d["shards"] = [{"sync": s.to_dict(version)} for s in self.shards]
        else:
            d["sync"] = self.sync.to_dict(version) if self.sync else None
        return d


@dataclass(frozen=True)
class BatchConfig:
    """Per-replica batch, gradient accumulation steps and the learning-rate scaling rule."""

    per_replica: int = 32
    accumulation: int = 1
    lr_scaling: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_replica": self.per_replica,
            "accumulation": self.accumulation,
            "lr_scaling": self.lr_scaling,
        }


@dataclass(frozen=True)
class GossipConfig:
    """Decentralised averaging (BlueFog): topology name, static or dynamic, and how ranks combine.

    Synchronous (``asynchronous=False``): every step averages with the in-neighbours, ``mode``
    ATC or AWC. Asynchronous: no barrier, each rank at its own pace over one-sided windows,
    ``mode`` ``push_sum`` (the weight carried with every message, parameters read as x / w) or
    ``average`` (neighbour averaging of the newest values each neighbour put).
    """

    topology: str = "exp2"
    dynamic: bool = False
    mode: str = "atc"
    asynchronous: bool = False

    def to_dict(self, version: int = STRATEGY_VERSION) -> dict[str, Any]:
        d: dict[str, Any] = {"topology": self.topology, "dynamic": self.dynamic, "mode": self.mode}
        if version >= 3:
            d["asynchronous"] = self.asynchronous
        return d


@dataclass(frozen=True)
class Strategy:
    """A complete plan: every trainable variable exactly once, plus global settings.

    Averaging semantics: the mean over all replicas of one global step.
    """

    variables: tuple[VariablePlan, ...]
    ranks: tuple[RankSpec, ...]
    servers: tuple[int, ...] = ()
    backend: str = "auto"
    batch: BatchConfig = field(default_factory=BatchConfig)
    gossip: GossipConfig | None = None
    builder: str = "custom"
    options: dict[str, Any] = field(default_factory=dict)
    version: int = STRATEGY_VERSION

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def name(self) -> str:
        """A short label: the builder and its non-default options."""
        if not self.options:
            return self.builder
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"{self.builder}({opts})"

    @property
    def consistency(self) -> tuple[bool, int]:
        """The PS variables' (sync, staleness), one per strategy; (True, 0) when it has none."""
        for p in self.variables:
            for s in p.syncs:
                if s.kind == "ps":
                    return s.consistency
        return True, 0

    @property
    def stale(self) -> bool:
        """Its PS variables are stale-synchronous or asynchronous (runtime/stale_ps.py runs them)."""
        return self.consistency != (True, 0)

    def plan(self, name: str) -> VariablePlan:
        for p in self.variables:
            if p.name == name:
                return p
        from distlab.errors import StrategyError

        raise StrategyError(f"variables: no plan for {name!r} in strategy {self.name}")

    # -- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "builder": {"name": self.builder, "options": dict(self.options)},
            "ranks": [r.to_dict() for r in self.ranks],
            "servers": list(self.servers),
            "backend": self.backend,
            "batch": self.batch.to_dict(),
            "gossip": self.gossip.to_dict(self.version) if self.gossip else None,
            "variables": [v.to_dict(self.version) for v in self.variables],
        }

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (temp file + rename)."""
        from distlab.files import write_atomic

        return write_atomic(path, self.to_json())

    @classmethod
    def from_dict(cls, d: Any, profile: ModelProfile | None = None) -> Strategy:
        from distlab.strategy.parse import parse_strategy

        return parse_strategy(d, profile)

    @classmethod
    def from_json(cls, text: str, profile: ModelProfile | None = None) -> Strategy:
        from distlab.strategy.parse import parse_strategy_json

        return parse_strategy_json(text, profile)

    @classmethod
    def load(cls, path: str | Path, profile: ModelProfile | None = None) -> Strategy:
        from distlab.errors import StrategyError

        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise StrategyError(f"strategy file {str(path)!r}: cannot read it ({exc.strerror})") from None
        return cls.from_json(text, profile)

    # -- rendering --------------------------------------------------------------------------
    def summary(self) -> str:
        kinds: dict[str, int] = {}
        for p in self.variables:
            for s in p.syncs:
                kinds[s.kind] = kinds.get(s.kind, 0) + 1
        parts = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        n_part = sum(p.partition is not None for p in self.variables)
        return (
            f"{self.name}: {len(self.variables)} variables ({parts}; {n_part} partitioned) "
            f"on {self.world} ranks, batch {self.batch.per_replica}/replica"
        )

    def __repr__(self) -> str:
        return f"<Strategy {self.summary()}>"

    def to_frame(self):  # -> pandas.DataFrame
        """One row per variable or shard: name, shard, kind, group, server, compressor."""
        import pandas as pd

        rows = []
        for p in self.variables:
            for i, s in enumerate(p.syncs):
                rows.append(
                    {
                        "variable": p.name,
                        "shard": i if p.partition is not None else None,
                        "axis": p.partition.axis if p.partition else None,
                        "kind": s.kind,
                        "group": s.group,
                        "server": s.server,
                        "compressor": s.compressor,
                        **(
                            {
                                "sync": s.sync,
                                "staleness": s.staleness,
                                "local_replication": s.local_replication,
                            }
                            if s.kind == "ps"
                            else {}
                        ),
                    }
                )
        return pd.DataFrame(rows)

    def _repr_html_(self) -> str:
        import html

        return f"<p><b>{html.escape(self.summary())}</b></p>" + self.to_frame().to_html(index=False)
