"""What a launch settles before anything runs on the workers: the model and the data checked on a
batch of the data, the strategy built for the batch the run trains at, the model's profile there,
and how the run's card describes its data and loss.

The user's data is the truth: the model is checked and profiled on a batch of it at the per-replica
batch it will train at (a builder name is built for that batch). A relaunch of the same model and
data reuses the profile (``ProfileCache``, held by the Lab).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distlab.keras_model import as_module
from distlab.profiling.model_profile import DEFAULT_BATCH
from distlab.runs import validate as _v
from distlab.runs.report import model_name
from distlab.strategy.types import Strategy

if TYPE_CHECKING:
    import torch

    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec


# (id(model), batch, id(data)) -> (model ref, data ref, profile)
ProfileCache = dict[tuple[int, int, int], tuple[Callable[[], Any], Callable[[], Any], "ModelProfile"]]


@dataclasses.dataclass
class Prepared:
    """A launch's checked inputs: ``profile(n)`` profiles the model at per-replica batch ``n``
    (``batch`` when None) on a batch of the data, once per batch."""

    model: torch.nn.Module
    data: Any
    strategy: Strategy
    batch: int
    profile: Callable[[int | None], ModelProfile]
    data_info: str
    loss_info: str


def prepare_launch(
    model: Any,
    strategy: Any,
    data: Any,
    loss: Any,
    optimizer: Any,
    batch_size: int | None,
    seed: int,
    resources: ResourceSpec,
    cache: ProfileCache,
) -> Prepared:
    """Check ``model``, ``data`` and ``strategy`` for a launch on ``resources`` (each bad input: one
    ``LaunchError`` or ``StrategyError`` naming it); ``data=None`` becomes synthetic samples of the
    model's input spec."""
    from distlab.data import as_dataset, describe
    from distlab.runtime.trainer import loss_name

    model = as_module(model)  # a Keras 3 model: on the torch backend, as a torch module
    _v.check_model(model)
    _v.check_loss(loss)
    data = as_dataset(data)
    hint = batch_size or (strategy.batch.per_replica if isinstance(strategy, Strategy) else DEFAULT_BATCH)
    batches: dict[int, Any] = {}
    profiles: dict[int, ModelProfile] = {}

    def batch_of(n: int) -> Any:
        if n not in batches:
            batches[n] = _v.check_data(data, model, loss, n)
        return batches[n]

    def profile(n: int | None = None) -> ModelProfile:
        n = n or hint
        if n not in profiles:
            key = (id(model), n, id(data))
            hit = cache.get(key)
            if hit is not None and hit[0]() is model and hit[1]() is data:
                profiles[n] = hit[2]
            else:
                profiles[n] = profile_at(model, n, None if data is None else batch_of(n)[0])
                cache[key] = (weakref.ref(model), _ref(data), profiles[n])
        return profiles[n]

    st, _ = _v.resolve_strategy(strategy, model, resources, profile, batch_size=batch_size or hint)
    _v.check_strategy_fits(st, model, resources.world, optimizer)
    b = batch_size or st.batch.per_replica
    if data is None:
        data = _v.synthetic_data(model, profile(b), max(b * st.world * 4, 256), seed)
        data_info = (
            f"synthetic: {len(data):,} random samples from {model_name(model)}'s input spec "
            "(pass data= to train on yours)"
        )
    else:
        data_info = describe(data)
    loss_info = loss_name(loss, batch_of(b)[1])  # the data's checks first: empty, unreadable, unfit
    _v.check_global_batch(len(data), b, st.batch.accumulation, st.world)
    return Prepared(model, data, st, b, profile, data_info, loss_info)


def profile_at(model: Any, batch_size: int, sample_input: Any = None) -> ModelProfile:
    """The model's profile (dl.profile) at ``batch_size``, on ``sample_input`` (a batch of the run's
    data) when given."""
    from distlab.profiling.torch_profiler import profile

    return profile(model, sample_input=sample_input, batch_size=batch_size)


def _ref(obj: Any) -> Callable[[], Any]:
    """A weak reference where the object allows one (None and tuples do not: held strongly)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj
