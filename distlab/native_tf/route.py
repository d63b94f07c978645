"""The TensorFlow route (``backend="tensorflow"``) behind the route interface (runs/route.py): a
Keras model in TensorFlow's own multi-worker runtime, each rank a child process of its Dask task.
The work is in ``launch.py`` (checks, payload, Run), ``rank.py`` (the rank's task), ``calibrate.py``
(TensorFlow's side of the cost model) and ``costmodel/native.py`` (its prediction)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distlab.runs.route import LabSide, LaunchRequest, Route

if TYPE_CHECKING:
    from distlab.costmodel.model import CostModel
    from distlab.runs.run import Forecast, Run
    from distlab.runtime.job import RankJob


class NativeRoute(Route):
    """TensorFlow's runtime: AllReduce, PS and PartitionedPS; not traced, not elastic."""

    name = "tensorflow"
    traced = False

    def launch(self, lab: LabSide, request: LaunchRequest) -> tuple[Run, CostModel | None]:
        from distlab.native_tf.launch import launch_native

        return launch_native(lab, request, self), lab.cost_model()

    def rank_call(
        self, run: Run, job: RankJob, restart: int, threads: list[int]
    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        from distlab.native_tf.rank import train_rank_tf

        return train_rank_tf, (run.payload, run.topic, restart, run.id, threads[0], job.timeout)

    def forecast(
        self, cost_model: CostModel | None, profile: Any, res: Any, st: Any, optimizer: str | None = None
    ) -> Forecast | None:
        from distlab.native_tf.launch import native_forecast

        return native_forecast(cost_model, profile, res, st)

    def trained_model(self, launched: Any, weights: Any) -> Any:
        import keras

        clone = keras.models.clone_model(launched)
        clone.set_weights(weights)  # rank 0's Keras weights, in the order of get_weights()
        return clone

    def no_prediction(self, run: Run) -> str:
        if run.strategy.builder in ("PS", "PartitionedPS"):
            return "none: native parameter-server runs (asynchronous rounds) are not predicted"
        return (
            "none: TensorFlow's collectives were not calibrated at launch; "
            'lab.calibrate(backend="tensorflow", models=[model]) measures them'
        )

    def calibrate(
        self, lab: LabSide, *, sizes: Any, cache: bool, progress: bool, models: Any, batch_size: int
    ) -> CostModel:
        from distlab.native_tf.calibrate import calibrate_native

        return calibrate_native(
            lab.cluster, lab.cache_dir, lab.cost_model(), models, batch_size, cache, progress
        )
