"""What an adaptive (AdaptiveBatch) launch hands its ranks: the goodput controller's step-time table."""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any

from distlab.errors import DistlabWarning
from distlab.strategy.builders.adaptive_batch import adaptive_bounds
from distlab.strategy.types import BatchConfig

if TYPE_CHECKING:
    from distlab.costmodel.model import CostModel
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec
    from distlab.strategy.types import Strategy


def adaptive_options(
    cm: CostModel,
    profile: ModelProfile,
    resources: ResourceSpec,
    st: Strategy,
    batch: int,
    optimizer: str | None = None,
) -> dict[str, Any]:
    """``RunOptions`` fields of a launch of ``st`` (runtime/job.py): for an AdaptiveBatch strategy, the base
    batch and the cost model's predicted seconds per step of every configuration its bounds
    allow (``[[per_replica, accumulation, seconds], ...]``); nothing for a fixed batch."""
    bounds = adaptive_bounds(st)
    if bounds is None:
        return {}
    bounds.check(st.world)
    on_servers = [p.name for p in st.variables if any(s.kind == "ps" for s in p.syncs)]
    if optimizer == "adam" and on_servers:
        warnings.warn(
            f"strategy {st.name}: with an Adam-like optimizer the live noise scale leaves out the "
            f"{len(on_servers)} of {len(st.variables)} variable(s) on parameter servers (their "
            "optimizer state is on the server: runtime/noise.py), so the batch adapts to "
            + ("no measured noise at all" if len(on_servers) == len(st.variables) else "the others' noise")
            + "; optimizer='sgd' (or a replicated strategy) measures every variable",
            DistlabWarning,
            stacklevel=5,  # lab.launch's caller (via the route's launch)
        )
    configs = bounds.configurations(st.world)
    plans = [dataclasses.replace(st, batch=BatchConfig(b, k, st.batch.lr_scaling)) for b, k in configs]
    seconds = cm.evaluate_many(profile, resources, plans, optimizer)["step_time"]
    table = [[b, k, float(s)] for (b, k), s in zip(configs, seconds, strict=True)]
    return {"adaptive": {"table": table}, "base_batch": int(batch)}


@dataclasses.dataclass(frozen=True)
class AdaptiveForecast:
    """What an adaptive strategy is predicted to do at a noise scale: the configuration the goodput
    controller would choose (per-replica batch x accumulation x world = ``global_batch``), its
    predicted ``step_time`` (s), ``throughput`` (samples/s), ``efficiency`` against the base batch
    and ``goodput`` (samples/s x efficiency)."""

    noise_scale: float
    per_replica: int
    accumulation: int
    global_batch: int
    step_time: float
    throughput: float
    efficiency: float
    goodput: float


def adaptive_forecast(
    cm: CostModel, profile: ModelProfile, resources: ResourceSpec, st: Strategy, noise_scale: float
) -> AdaptiveForecast | None:
    """The configuration an AdaptiveBatch strategy's controller would choose at ``noise_scale``
    (samples), priced by ``cm`` as a launch prices it; None for a strategy of fixed batch."""
    from distlab.adaptive.controller import GoodputController
    from distlab.adaptive.goodput import statistical_efficiency

    base = st.batch.per_replica
    extra = adaptive_options(cm, profile, resources, st, base)
    if not extra:
        return None
    table = {(int(b), int(k)): s for b, k, s in extra["adaptive"]["table"]}
    ctl = GoodputController(table, st.world, base)
    b, k = ctl.best(float(noise_scale))
    m = b * k * st.world
    seconds = ctl.step_time((b, k))
    eff = float(statistical_efficiency(m, float(noise_scale), base))
    return AdaptiveForecast(float(noise_scale), b, k, m, seconds, m / seconds, eff, m / seconds * eff)
