"""Strategy builders, one file per technique: pure functions ``(profile, resources, **options) ->
Strategy``."""

from distlab.strategy.builders import (  # noqa: F401  (importing registers each builder)
    adaptive_batch,
    allreduce,
    gossip,
    parallax,
    partitioned_ar,
    partitioned_ps,
    ps,
    random_axis_ar,
)
from distlab.strategy.builders._registry import build, builder_options, builders, option_defaults

__all__ = ["build", "builder_options", "builders", "option_defaults"]
