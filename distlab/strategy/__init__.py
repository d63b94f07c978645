"""Strategies: the per-variable plan, its validation, the builders that produce it."""

from distlab.strategy.builders import build, builder_options, builders
from distlab.strategy.candidates import candidates
from distlab.strategy.parse import parse_strategy, parse_strategy_json, validate
from distlab.strategy.types import (
    BatchConfig,
    GossipConfig,
    Partition,
    RankSpec,
    Strategy,
    Sync,
    VariablePlan,
)

__all__ = [
    "BatchConfig",
    "GossipConfig",
    "Partition",
    "RankSpec",
    "Strategy",
    "Sync",
    "VariablePlan",
    "build",
    "builder_options",
    "builders",
    "candidates",
    "parse_strategy",
    "parse_strategy_json",
    "validate",
]
