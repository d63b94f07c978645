"""What an adaptive (AdaptiveBatch) launch hands its ranks: the goodput controller's step-time table."""

from __future__ import annotations

import dataclasses
from typing import Any

from distlab.strategy.builders.adaptive_batch import adaptive_bounds
from distlab.strategy.types import BatchConfig


def adaptive_extra(cm: Any, profile: Any, resources: Any, st: Any, batch: int) -> dict[str, Any]:
    """``RankJob.extra`` entries of a launch of ``st``: for an AdaptiveBatch strategy, the base
    batch and the cost model's predicted seconds per step of every configuration its bounds
    allow (``[[per_replica, accumulation, seconds], ...]``); nothing for a fixed batch."""
    bounds = adaptive_bounds(st)
    if bounds is None:
        return {}
    bounds.check(st.world)
    configs = bounds.configurations(st.world)
    plans = [
        dataclasses.replace(st, batch=BatchConfig(b, k, st.batch.lr_scaling)) for b, k in configs
    ]
    seconds = cm.evaluate_many(profile, resources, plans)["step_time"]
    table = [[b, k, float(s)] for (b, k), s in zip(configs, seconds, strict=True)]
    return {"adaptive": {"table": table}, "base_batch": int(batch)}
