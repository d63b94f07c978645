"""One run's share of a Lab's cluster: the workers a scheduler gave it, as its route sees the cluster.

A route plans, places and re-plans a run on ``lab.cluster.resources`` (runs/route.py); under a
shared Lab each run gets a ``ClusterView`` instead, so the same route code plans for the run's own
workers, and a resize moves the view before the run resumes on the new set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distlab.strategy.execution import rank_threads


class ClusterView:
    """The workers ``workers`` of ``cluster``; everything else (client, timeout, ...) is the cluster's."""

    def __init__(self, cluster: Any, workers: Sequence[str]) -> None:
        self._cluster = cluster
        self.workers = tuple(workers)

    def move_to(self, workers: Sequence[str]) -> None:
        """The run's workers from now on (before it resumes on them: its re-plan reads them)."""
        self.workers = tuple(workers)

    @property
    def resources(self) -> Any:
        """The run's workers as a ResourceSpec, ranked in the order they were given."""
        return self._cluster.resources.of_workers(list(self.workers))

    def first(self, k: int, res: Any = None) -> list[str]:
        return list((res or self.resources).addresses)[:k]

    def threads_for(self, workers: list[str], res: Any = None) -> list[int]:
        """torch threads per rank: a host's cores shared among every Lab worker on it, not only this
        run's, since the other runs' ranks compute on the same cores at the same time."""
        full = self._cluster.resources
        sub = full.of_workers(workers)
        return [rank_threads(len(full.ranks_on(r.host)), full.cores.get(r.host, 1)) for r in sub.ranks]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)
