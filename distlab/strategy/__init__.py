"""Strategies: the per-variable plan, its validation, the builders that produce it."""

from distlab.strategy.builders import build, builder_options, builders
from distlab.strategy.candidates import candidates
from distlab.strategy.types import (
    BatchConfig,
    GossipConfig,
    Partition,
    RankSpec,
    Strategy,
    Sync,
    VariablePlan,
)
from distlab.strategy.validate import parse_strategy, parse_strategy_json, validate

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
