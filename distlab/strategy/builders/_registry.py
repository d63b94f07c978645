"""The builder registry: names -> pure functions, option checking and recording of non-default options."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distlab.errors import StrategyError
from distlab.strategy.types import Strategy

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec

Builder = Callable[..., Strategy]
REGISTRY: dict[str, Builder] = {}
# The order builders are listed in: AutoDist's builders, then the other seeds' techniques.
ORDER = (
    "PS",
    "PSLoadBalancing",
    "PartitionedPS",
    "UnevenPartitionedPS",
    "AllReduce",
    "PartitionedAR",
    "RandomAxisPartitionAR",
    "Parallax",
    "Gossip",
    "AdaptiveBatch",
)


def option_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """Keyword options of a builder and their defaults."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def register(name: str) -> Callable[[Builder], Builder]:
    """Register a builder ``(profile, resources, *, options...) -> Strategy`` under ``name``.

    The wrapper rejects unknown options (listing the valid ones), sets ``Strategy.builder`` and
    records every option that differs from its default in ``Strategy.options``.
    """

    def deco(fn: Builder) -> Builder:
        defaults = option_defaults(fn)
        takes_more = any(
            p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values()
        )

        @functools.wraps(fn)
        def wrapper(profile: ModelProfile, resources: ResourceSpec, **options: Any) -> Strategy:
            unknown = sorted(set(options) - set(defaults))
            if unknown and not takes_more:
                raise StrategyError(
                    f"{name}: unknown option {unknown[0]!r}; valid options: {', '.join(defaults)}"
                )
            strategy = fn(profile, resources, **options)
            recorded = dict(strategy.options)
            for k, v in options.items():
                if k == "batch_size":
                    if v is not None and v != profile.batch_size:
                        recorded[k] = v
                elif k in defaults and v != defaults[k]:
                    recorded[k] = _jsonable(v)
            return dataclasses.replace(strategy, builder=name, options=recorded)

        wrapper.builder_name = name  # type: ignore[attr-defined]
        REGISTRY[name] = wrapper
        return wrapper

    return deco


def builders() -> list[str]:
    """Names of every registered builder."""
    return sorted(REGISTRY, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def builder_options(name: str) -> dict[str, Any]:
    """The keyword options builder ``name`` accepts, with their defaults."""
    try:
        return option_defaults(REGISTRY[name])
    except (KeyError, TypeError):
        raise StrategyError(f"builder {name!r} is not known; use one of: {', '.join(builders())}") from None


def build(name: str, profile: ModelProfile, resources: ResourceSpec, **options: Any) -> Strategy:
    """Run builder ``name``; an unknown name or option is a ``StrategyError`` listing the valid ones."""
    try:
        fn = REGISTRY[name]
    except (KeyError, TypeError):
        raise StrategyError(f"builder {name!r} is not known; use one of: {', '.join(builders())}") from None
    return fn(profile, resources, **options)
