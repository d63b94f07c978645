"""Strategies: the per-variable plan, its validation, the builders that produce it.

``types`` the ``Strategy`` and its parts (frozen, serialisable); ``parse`` reads and validates its
JSON (the field path at fault); ``builders/`` one file per AutoDist, AdaptDL or BlueFog builder
(``_registry`` names them); ``candidates`` every builder's plan for a model; ``execution`` what the
runtime executes for a strategy (buckets, DDP, threads, the gossip topology), described once.
"""

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
