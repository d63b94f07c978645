"""Match a Strategy to a live model: validate it, and lay out one sync unit per variable or shard."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distlab.errors import StrategyError
from distlab.strategy.types import COMPRESSORS, SYNC_KINDS, Strategy, Sync


@dataclass
class SyncUnit:
    """One variable, or one shard of it, with its own sync.

    ``axis``/``offset``/``size`` locate the shard (``axis is None``: the whole variable).
    ``shadow`` is the shard's own parameter (what its optimizer updates) for partitioned
    variables; unpartitioned ones are updated in place.
    """

    name: str
    param: torch.nn.Parameter
    sync: Sync
    shard: int | None = None
    axis: int | None = None
    offset: int = 0
    size: int = 0
    shadow: torch.nn.Parameter | None = None

    def view(self, t: torch.Tensor) -> torch.Tensor:
        """This unit's slice of a tensor shaped like the variable (a view, no copy)."""
        return t if self.axis is None else t.narrow(self.axis, self.offset, self.size)

    @property
    def target(self) -> torch.nn.Parameter:
        """The tensor the optimizer steps: the shard's shadow, or the variable itself."""
        return self.shadow if self.shadow is not None else self.param

    @property
    def label(self) -> str:
        return self.name if self.shard is None else f"{self.name}[shard {self.shard}]"


def build_units(model: torch.nn.Module, strategy: Strategy, world: int) -> list[SyncUnit]:
    """Validate ``strategy`` against ``model`` and return its sync units in model order.

    Raises ``StrategyError`` naming the variable for a missing or extra variable, a partition
    that does not fit the variable's shape, or a server rank outside the world.
    """
    if strategy.world != world:
        raise StrategyError(
            f"strategy.ranks: the strategy has {strategy.world} ranks but the run has {world}; rebuild it "
            f"for {world}"
        )
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    plans = {}
    for i, p in enumerate(strategy.variables):
        if p.name in plans:
            raise StrategyError(f"variables[{i}]: {p.name!r} appears twice; plan each variable once")
        if p.name not in params:
            raise StrategyError(
                f"variables[{i}]: {p.name!r} is not a trainable parameter of the model; rebuild the strategy "
                "for this model"
            )
        plans[p.name] = (i, p)
    missing = [n for n in params if n not in plans]
    if missing:
        raise StrategyError(
            f"variables: model parameter {missing[0]!r} has no plan ({len(missing)} missing); rebuild the "
            "strategy for this model"
        )
    units: list[SyncUnit] = []
    for name, param in params.items():
        i, plan = plans[name]
        where = f"variables[{i}] ({name!r})"
        for s in plan.syncs:
            _check_sync(s, where, world)
        if plan.partition is None:
            if plan.sync is None:
                raise StrategyError(f"{where}.sync: missing; give the variable a sync or a partition")
            units.append(SyncUnit(name, param, plan.sync))
            continue
        axis, shards = plan.partition.axis, plan.partition.shards
        if not 0 <= axis < param.dim():
            raise StrategyError(
                f"{where}.partition.axis: {axis} is out of range for shape {tuple(param.shape)}"
            )
        if not 1 <= shards <= param.shape[axis]:
            raise StrategyError(
                f"{where}.partition.shards: {shards} shards do not fit dimension {axis} of shape "
                f"{tuple(param.shape)}"
            )
        if len(plan.shards) != shards:
            raise StrategyError(
                f"{where}.shards: {len(plan.shards)} syncs for {shards} shards; give one sync per shard"
            )
        offset = 0
        for k, (size, s) in enumerate(zip(plan.partition.sizes(param.shape[axis]), plan.shards)):
            u = SyncUnit(name, param, s, shard=k, axis=axis, offset=offset, size=size)
            u.shadow = torch.nn.Parameter(u.view(param.detach()).clone())
            units.append(u)
            offset += size
    return units


def _check_sync(s: Sync, where: str, world: int) -> None:
    if s.kind not in SYNC_KINDS:
        raise StrategyError(f"{where}.sync.kind: unknown {s.kind!r}; use one of {', '.join(SYNC_KINDS)}")
    if s.compressor not in COMPRESSORS:
        raise StrategyError(
            f"{where}.sync.compressor: unknown {s.compressor!r}; use one of {', '.join(COMPRESSORS)}"
        )
    if s.kind == "ps" and (s.server is None or not 0 <= s.server < world):
        raise StrategyError(f"{where}.sync.server: rank {s.server} does not exist ({world} ranks)")
