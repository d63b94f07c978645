"""The route interface: how one launch sequence reaches two runtimes (Keras's backend switch is
the model: one ``fit``, a backend chosen once).

``Lab.launch`` checks what every launch shares (steps, batch, the user's loss and optimizer
conventions, an idle cluster), picks the route for ``backend`` once and hands it a
``LaunchRequest`` and the ``LabSide`` (what a route may use of its Lab). A ``Route``:

- ``launch``: checks and prepares the model, data and strategy, predicts, and returns the Run
  (not started: the Lab starts it) and the Lab's cost model after it (the torch route measures the
  model's own step into it);
- ``rank_call``: the function each rank's Dask task runs and its arguments;
- ``forecast``: the Lab's prediction of a run before it starts;
- ``trained_model``: the launched model with rank 0's trained weights;
- ``no_prediction``: why a run has no prediction and the call that gives one;
- ``calibrate``: ``lab.calibrate(backend=...)``'s campaign for this route.

The routes: ``distlab/torch_route.py`` (distlab's own runtime, every builder) and
``distlab/native_tf/route.py`` (a Keras model in TensorFlow's multi-worker runtime).
"""

from __future__ import annotations

import abc
import dataclasses
import itertools
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from distlab.cluster.cluster import Cluster
    from distlab.costmodel.model import CostModel
    from distlab.runs.prepare import ProfileCache
    from distlab.runs.run import Forecast, Run, RunHooks
    from distlab.runtime.job import RankJob


_RUN_NUMBERS = itertools.count(1)  # run ids: r1, r2, ... across every Lab of this process


def next_run_id() -> str:
    """A run's id: its number in this process (unique across a notebook's Labs) and a random
    suffix (its rendezvous keys' prefix)."""
    return f"r{next(_RUN_NUMBERS)}-{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass(frozen=True)
class LaunchRequest:
    """One ``lab.launch`` call, its shared checks passed (``Lab.launch`` documents each argument)."""

    model: Any
    strategy: Any
    steps: int
    data: Any
    loss: Any
    optimizer: Any  # resolved by distlab.conventions: a factory or an OptimizerSpec
    batch_size: int | None
    shuffle: bool
    seed: int
    checkpoint_every: int | None
    elastic: bool
    timeout: float | None
    trace: bool
    optimizer_info: str = ""  # the card's words for the optimizer and where it came from
    metrics: tuple[Any, ...] = ()  # compile's metrics (distlab.step_metrics)
    slowdown: tuple[tuple[int, float], ...] = ()  # (rank, factor): stragglers asked for
    jitter: float = 0.0  # every rank's compute varies step to step by this fraction (RunOptions.jitter)


@dataclasses.dataclass(frozen=True)
class LabSide:
    """What a route may use of the Lab that launches: its ``cluster``, the ``hooks`` its runs get,
    ``cost_model()`` (the Lab's model now: a refit between a launch and an elastic replan counts),
    where it caches calibrations and writes checkpoints, and its cache of profiles."""

    cluster: Cluster
    hooks: RunHooks
    cost_model: Callable[[], CostModel | None]
    cache_dir: Path
    checkpoint_dir: Path
    profiles: ProfileCache


class Route(abc.ABC):
    """A runtime a launch can take (module docstring). Stateless: one instance serves every run."""

    name: ClassVar[str]  # the ``backend=`` that picks it
    traced: ClassVar[bool]  # whether ``trace=True`` records its ranks' timelines

    @abc.abstractmethod
    def launch(self, lab: LabSide, request: LaunchRequest) -> tuple[Run, CostModel | None]:
        """(client) The checked, predicted, unstarted Run of ``request``, and the Lab's cost model
        after it."""

    @abc.abstractmethod
    def rank_call(
        self, run: Run, job: RankJob, restart: int, threads: list[int]
    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The function rank ``job.rank``'s task runs on its worker, and its arguments."""

    @abc.abstractmethod
    def forecast(
        self, cost_model: CostModel | None, profile: Any, res: Any, st: Any, optimizer: str | None = None
    ) -> Forecast | None:
        """The prediction of ``st`` on the first ``st.world`` ranks of ``res``; None when this
        route's side of ``cost_model`` is not calibrated (or there is none)."""

    @abc.abstractmethod
    def trained_model(self, launched: Any, weights: Any) -> Any:
        """A copy of the ``launched`` model holding rank 0's trained ``weights``."""

    @abc.abstractmethod
    def no_prediction(self, run: Run) -> str:
        """Why ``run`` has no prediction, and the call that gives the next one."""

    @abc.abstractmethod
    def calibrate(
        self, lab: LabSide, *, sizes: Any, cache: bool, progress: bool, models: Any, batch_size: int
    ) -> CostModel:
        """``lab.calibrate(backend=self.name, ...)``: the Lab's cost model with this route's side
        measured (cached in ``lab.cache_dir``)."""
