"""A launched strategy re-planned for another set of workers (elastic resume, lab.scale)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from distlab.errors import LaunchError
from distlab.resources import ResourceSpec


def replan(st: Any, model: Any, res: ResourceSpec, profile: Callable[[], Any]) -> Any:
    """The strategy re-planned for ``res`` (elastic resume on fewer workers)."""
    if st.world == res.world and [(r.host, r.device) for r in st.ranks] == [
        (r.host, r.device) for r in res.ranks
    ]:
        return st
    try:
        from distlab import strategy as strategies

        # same per-replica batch and gradient accumulation: only the number of replicas changes
        return dataclasses.replace(strategies.build(st.builder, profile(), res, **st.options), batch=st.batch)
    except Exception as exc:  # noqa: BLE001
        if st.builder == "custom" or not hasattr(strategies, "build"):
            return _shrink(st, res, exc)
        raise LaunchError(f"elastic resume: cannot re-plan {st.name} for {res.world} ranks ({exc})") from None


def _shrink(st: Any, res: ResourceSpec, exc: Exception) -> Any:
    """A hand-made strategy on fewer ranks: keep it if it names no rank that is gone."""
    used = set(st.servers) | {s.server for p in st.variables for s in p.syncs if s.server is not None}
    if used and max(used) >= res.world:
        raise LaunchError(
            f"elastic resume: strategy {st.name} uses server ranks {sorted(used)} and cannot run on "
            f"{res.world} ranks ({exc})"
        )
    return dataclasses.replace(st, ranks=tuple(res.ranks))
