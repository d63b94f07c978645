"""Native TensorFlow runs (``lab.launch(keras_model, ..., backend="tensorflow")``): each rank a
child process of its pinned Dask task. AllReduce runs as MultiWorkerMirroredStrategy; PS and
PartitionedPS as ParameterServerStrategy (each rank's process a worker and a parameter server,
rank 0's also the chief; the other ranks serve until the chief's rank says it is done).

The client builds one payload (``native_payload``): the model as a ``.keras`` file, the data as
arrays, the loss and an optimizer factory; each rank's task is ``tf_rank.train_rank_tf``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from distlab.errors import LaunchError

if TYPE_CHECKING:
    from distlab.costmodel.model import CostModel
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec
    from distlab.runs.route import LabSide, LaunchRequest, Route
    from distlab.runs.run import Run
    from distlab.strategy.types import Strategy

# the builders TensorFlow runs natively, and as what: MultiWorkerMirroredStrategy, ParameterServerStrategy
NATIVE_BUILDERS = {"AllReduce": "mirrored", "PS": "ps", "PartitionedPS": "ps"}


def check_native(model: Any, strategy: Any) -> None:
    """What the native route can run: a Keras 3 model, a builder of ``NATIVE_BUILDERS`` at
    synchronous consistency (distlab's stale and asynchronous PS run on the torch route only), a
    clean environment."""
    from distlab.keras_model import is_keras_model

    if not is_keras_model(model):
        raise LaunchError(
            f"backend='tensorflow': model must be a Keras model, got {type(model).__name__}; "
            "torch models run with backend='torch' (the default)"
        )
    if "TF_CONFIG" in os.environ:
        raise LaunchError(
            "backend='tensorflow': TF_CONFIG is set in this process's environment; distlab builds each "
            "rank's TF_CONFIG from the ports its workers choose: unset it (del os.environ['TF_CONFIG'])"
        )
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        raise LaunchError(
            "backend='tensorflow': TensorFlow is not installed; pip install 'distlab[tf]' (or run the Keras "
            "model with backend='torch')"
        )
    builder = getattr(strategy, "builder", strategy)
    if builder not in NATIVE_BUILDERS:
        raise LaunchError(
            f"backend='tensorflow': strategy {getattr(strategy, 'name', strategy)} is not one TensorFlow "
            "runs natively here (natively: AllReduce as MultiWorkerMirroredStrategy, PS and PartitionedPS "
            "as ParameterServerStrategy); run it with backend='torch'"
        )
    field = consistency_field(strategy)
    if field:
        raise LaunchError(
            f"backend='tensorflow': strategy {strategy.name} asks for {field}, which TensorFlow's "
            "ParameterServerStrategy does not run (it would train its own way); run it with backend='torch'"
        )


def consistency_field(strategy: Any) -> str:
    """The first PS consistency field of ``strategy`` that is not synchronous (``"staleness=2"``,
    ``"sync=False"``, ``"local_replication=True"``), else "" (a builder name has none)."""
    for v in getattr(strategy, "variables", ()):
        for sync in v.syncs:
            if sync.kind != "ps":
                continue
            if sync.local_replication:
                return "local_replication=True"
            if not sync.sync:
                return "sync=False"
            if sync.staleness:
                return f"staleness={sync.staleness}"
    return ""


def arrays(data: Any) -> tuple[Any, Any]:
    """``data`` as (inputs, targets) NumPy arrays: what the TensorFlow processes read."""
    import numpy as np

    from distlab.data import as_dataset

    ds = as_dataset(data)
    tensors = getattr(ds, "tensors", None) or (getattr(ds, "inputs", None), getattr(ds, "targets", None))
    if tensors[0] is None:
        raise LaunchError("backend='tensorflow': data must be an (inputs, targets) pair of arrays or tensors")
    x, y = (np.asarray(t.cpu() if hasattr(t, "cpu") else t) for t in tensors[:2])
    return x, y


def _check_plain_sgd(optimizer: Any) -> None:
    """Natively, partitioned variables train with plain SGD (Keras 3's optimizers cannot update
    TensorFlow's ShardedVariables): refuse any other optimizer before the launch."""
    if optimizer is None:
        return
    if hasattr(optimizer, "kind"):  # distlab.conventions.OptimizerSpec
        s, name = optimizer.settings, optimizer.describe()
        plain = optimizer.kind == "sgd" and not s["momentum"] and not s["nesterov"]
    else:
        opt = optimizer()
        name = type(opt).__name__
        plain = name == "SGD" and not float(getattr(opt, "momentum", 0.0) or 0.0)
        plain = plain and not getattr(opt, "nesterov", False)
    if not plain:
        raise LaunchError(
            "optimizer: natively, PartitionedPS trains its partitioned variables with plain SGD (Keras 3's "
            f"optimizers cannot update TensorFlow's partitioned variables), got {name}; pass "
            "optimizer=keras.optimizers.SGD(learning_rate=...) or 'sgd', or use backend='torch'"
        )


def native_payload(
    model: Any,
    x: Any,
    y: Any,
    strategy: Any,
    loss: Any,
    optimizer: Any,
    *,
    steps: int,
    batch: int,
    seed: int,
    shuffle: bool,
    shapes: dict[str, tuple[int, ...]],
    metrics: tuple[Any, ...] = (),
) -> dict[str, Any]:
    """What every rank's child process needs, as bytes and arrays (built once, in the client):
    the ``.keras`` file, the data, and the job (the mode the strategy's builder maps to; for
    PartitionedPS the shards of its partitioned variables, TensorFlow's FixedShardsPartitioner)."""
    import cloudpickle

    from distlab.keras_model import keras_file

    partition = []
    if (
        strategy.builder == "PartitionedPS"
    ):  # AutoDist's shards, as TensorFlow's partitioner sees variables: by shape
        partition = [
            (list(shapes[v.name]), v.partition.shards) for v in strategy.variables if v.partition is not None
        ]
        _check_plain_sgd(optimizer)
    job = child_job(steps, batch, seed, shuffle, loss, optimizer, metrics, partition)
    return {
        "keras": keras_file(model),
        "x": x,
        "y": y,
        "job": cloudpickle.dumps(job),
        "mode": NATIVE_BUILDERS[strategy.builder],
    }


def child_job(
    steps: int,
    batch: int,
    seed: int,
    shuffle: bool,
    loss: Any,
    optimizer: Any,
    metrics: tuple[Any, ...] = (),
    partition: list[Any] | None = None,
) -> dict[str, Any]:
    """The job a TensorFlow child unpickles: distlab's Keras losses, optimizers and metrics as
    plain data (their ``spec()``, a metric by its name), so that unpickling it imports nothing of
    distlab and so no torch (1.3-1.4 s of each rank's start when it carried distlab's objects);
    the user's own loss or optimizer factory as given."""
    from distlab.conventions import KerasLoss, OptimizerSpec

    return {
        "steps": steps,
        "batch": batch,
        "seed": seed,
        "shuffle": shuffle,
        "loss": loss.spec() if isinstance(loss, KerasLoss) else loss,
        "optimizer": optimizer.spec() if isinstance(optimizer, OptimizerSpec) else optimizer,
        "partition": partition or [],
        "metrics": [m.name for m in metrics],
    }


def _no_replan(survivors: list[str]) -> Any:
    raise LaunchError(
        "native TensorFlow runs do not resize (elastic=False): relaunch on the workers there are"
    )


def native_forecast(cm: CostModel | None, profile: ModelProfile, res: ResourceSpec, st: Strategy) -> Any:
    """The Lab's prediction of a native run (costmodel/native.py), or None before
    ``lab.calibrate(backend="tensorflow")`` and for builders it does not predict."""
    from distlab.costmodel.compute import model_key
    from distlab.costmodel.native import predict_native
    from distlab.runs.forecast import Forecast

    if cm is None or cm.native is None:
        return None
    sub = res.first(st.world)
    p = predict_native(cm.native, cm.without_refit(), profile, sub, st)
    return Forecast(p, p, profile, sub, model_key(profile)) if p is not None else None


def _native_optimizer(optimizer: Any, info: str, st: Strategy) -> tuple[Any, str]:
    """The launch's optimizer and its card words, natively: PartitionedPS's default is plain SGD
    (its partitioned variables take no other)."""
    if getattr(optimizer, "source", "") == "default" and st.builder == "PartitionedPS":
        from distlab.conventions import OptimizerSpec

        optimizer = OptimizerSpec("sgd", source="default")
        info = f"{optimizer.describe()}: natively, PartitionedPS's partitioned variables take plain SGD"
    return optimizer, info


def launch_native(lab: LabSide, request: LaunchRequest, route: Route) -> Run:
    """(client) ``lab.launch(..., backend="tensorflow")``: checks, profile and prediction as for a
    torch launch; the Run (not started: the Lab starts it) drives one rank per worker through
    ``route.rank_call`` (``train_rank_tf``)."""
    from distlab.data import describe
    from distlab.runs import validate as _v
    from distlab.runs.prepare import DEFAULT_BATCH
    from distlab.runs.prepare import profile_at as _profile
    from distlab.runs.run import Run
    from distlab.strategy.types import Strategy

    r, cluster = request, lab.cluster
    check_native(r.model, r.strategy)
    if r.data is None:
        raise LaunchError("backend='tensorflow': data is required: an (inputs, targets) pair of arrays")
    res = cluster.resources
    b = r.batch_size or (r.strategy.batch.per_replica if isinstance(r.strategy, Strategy) else DEFAULT_BATCH)
    x, y = arrays(r.data)
    prof = _profile(r.model, b, x[:b])
    st, _ = _v.resolve_strategy(r.strategy, r.model, res, lambda n=None: prof, batch_size=b)
    _v.check_world_fits(st, res.world)
    check_native(r.model, st)
    optimizer, optimizer_info = _native_optimizer(r.optimizer, r.optimizer_info, st)
    payload = native_payload(
        r.model,
        x,
        y,
        st,
        r.loss,
        optimizer,
        steps=r.steps,
        batch=b,
        seed=r.seed,
        shuffle=r.shuffle,
        shapes={v.name: v.shape for v in prof.variables},
        metrics=r.metrics,
    )
    workers = cluster.first(st.world, res)
    run_id = lab.hooks.new_id()
    job = _native_job(st, r.steps, b, r.seed, float(r.timeout or cluster.timeout), run_id, r.metrics)
    run = Run(
        lab.hooks,
        run_id,
        r.model,
        st,
        job,
        workers,
        cluster.threads_for(workers, res),
        route=route,
        elastic=False,
        replan=_no_replan,
        forecast=route.forecast(lab.cost_model(), prof, res, st),
        data_info=describe(r.data) + " (as arrays, in each TensorFlow process)",
        loss_info=getattr(r.loss, "__name__", None)
        or getattr(r.loss, "name", None)
        or ("Keras sparse categorical cross-entropy from logits (the default for integer targets)"),
        payload=payload,
    )
    run.optimizer_info = optimizer_info
    return run


def _native_job(
    st: Any, steps: int, batch: int, seed: int, timeout: float, run_id: str, metrics: tuple[Any, ...]
) -> Any:
    """The RankJob a native run's Run drives: its strategy, steps and deadline (the model and
    data travel in the payload; the metrics name the run's columns)."""
    from distlab.runtime.job import RankJob, RunOptions

    return RankJob.unplaced(
        st,
        None,
        steps,
        None,
        batch_size=batch,
        seed=seed,
        timeout=timeout,
        run_id=run_id,
        options=RunOptions(metrics=metrics),
    )
