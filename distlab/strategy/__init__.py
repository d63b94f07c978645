"""Strategies: the per-variable plan, its validation, the builders that produce it."""

from distlab.strategy.types import (
    BatchConfig,
    GossipConfig,
    Partition,
    RankSpec,
    Strategy,
    Sync,
    VariablePlan,
)

__all__ = ["BatchConfig", "GossipConfig", "Partition", "RankSpec", "Strategy", "Sync", "VariablePlan"]
