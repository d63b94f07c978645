"""(child process) One rank of a native TensorFlow run: ``python child.py JOB_DIR``.

Started by its rank's pinned Dask task (``distlab.native_tf.rank``) with ``TF_CONFIG`` set, in
a fresh process, or in a spare one that the worker started after its last TensorFlow rank
(``python child.py --spare``: TensorFlow already imported, ``wait_for_job``): TensorFlow's
multi-worker strategy must be created before any other TensorFlow op, a process can host one
such cluster only, and a peer that never arrives blocks its constructor with no timeout, so the
task, not this process, owns the deadline and kills it.

It imports nothing of distlab (torch stays out of the process). ``JOB_DIR`` holds ``model.keras``,
``data.npz`` (``x``, ``y``) and ``job.pkl`` (a cloudpickled dict: steps, batch, seed, shuffle,
the loss and an optimizer factory); ``DISTLAB_TF_THREADS`` and ``DISTLAB_TF_TIMEOUT`` (seconds
for a collective) come in the environment. Each step prints one JSON line of record to
stdout; at the end every rank prints a final line with a checksum of its weights, and rank 0
saves them to ``weights.npz``.

Training loop: AllReduce as ``MultiWorkerMirroredStrategy`` (ring all-reduce on CPUs), a custom
loop (Keras 3's ``fit`` fails with two workers: keras#20585, tensorflow#72388). Rank r reads
positions ``[pos + r*b, pos + (r+1)*b)`` of the epoch's order (a NumPy permutation seeded with
``seed + epoch`` when shuffling), the data position advancing by ``b * world`` per step; the
loss is averaged over the global batch.

Long because it is run by path in a process that imports nothing of distlab: the three programs a
rank runs (a mirrored run, a parameter-server rank, a calibration) and what they share stay here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def main(job_dir: str) -> int:
    """A MultiWorkerMirroredStrategy rank (see the module's docstring): prints a JSON record per
    step and a final one with its weights' checksum; rank 0 saves the weights.

    Long because it is one TensorFlow program run top to bottom: the strategy is created before any other
    TensorFlow op, then the model, the data and the loop."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import pickle

    import numpy as np

    tf = _import_tensorflow()

    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("DISTLAB_TF_THREADS", "1")))
    tf.config.threading.set_inter_op_parallelism_threads(1)
    timeout = float(os.environ.get("DISTLAB_TF_TIMEOUT", "60"))
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)  # first TF op
    import keras

    names = _keras_names()  # the builders of the job's plain specs

    with open(os.path.join(job_dir, "job.pkl"), "rb") as f:
        job = pickle.load(f)  # after the strategy: the user's loss may build TensorFlow objects

    cfg = json.loads(os.environ["TF_CONFIG"])
    rank, world = int(cfg["task"]["index"]), len(cfg["cluster"]["worker"])
    data = np.load(os.path.join(job_dir, "data.npz"))
    x, y = data["x"], data["y"]
    n, b = len(x), int(job["batch"])
    with strategy.scope():
        model = keras.saving.load_model(os.path.join(job_dir, "model.keras"), compile=False)
        optimizer = _optimizer(keras, job, names)
    if isinstance(job.get("loss"), dict):  # a Keras loss's spec (distlab.conventions.KerasLoss)
        per_sample = names.loss_from_spec(keras, job["loss"], per_sample=True)
    elif job.get("loss") is not None:
        per_sample = job["loss"]
    elif np.issubdtype(y.dtype, np.integer):
        per_sample = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    else:
        per_sample = keras.losses.MeanSquaredError(reduction=None)
    global_batch = b * world
    metrics = job.get("metrics") or ()  # compile's metrics by name (distlab.step_metrics), before the update

    @tf.function
    def train_step(xb, yb):
        def step_fn(xb, yb):
            with tf.GradientTape() as tape:
                out = model(xb, training=True)
                losses = per_sample(yb, out)
                loss = tf.reduce_sum(losses) / global_batch if losses.shape.rank else losses / world
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return [loss] + [
                tf.reduce_sum(tf.cast(names.metric_values(keras, m, yb, out), tf.float32)) / global_batch
                for m in metrics
            ]

        per_replica = strategy.run(step_fn, args=(xb, yb))
        return [strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for v in per_replica]

    orders: dict[int, np.ndarray] = {}

    def rows(pos: int) -> np.ndarray:
        positions = np.arange(pos + rank * b, pos + (rank + 1) * b)
        if not job.get("shuffle"):
            return positions % n
        out = np.empty_like(positions)
        for e in np.unique(positions // n):
            if e not in orders:
                orders.clear()
                orders[int(e)] = np.random.default_rng(int(job["seed"]) + int(e)).permutation(n)
            mask = positions // n == e
            out[mask] = orders[int(e)][positions[mask] % n]
        return out

    pos = int(job.get("start", 0))
    for step in range(int(job["steps"])):
        idx = rows(pos)
        t0 = time.perf_counter()
        loss, *values = (float(v) for v in train_step(tf.constant(x[idx]), tf.constant(y[idx])))
        t1 = time.perf_counter()
        pos += global_batch
        rec = {
            "step": step,
            "rank": rank,
            "loss": loss,
            "samples": pos,
            "step_time": t1 - t0,
            "comm_time": 0.0,
            "wall_time": time.time(),
            **dict(zip(metrics, values)),
        }
        print(json.dumps(rec), flush=True)
    weights = model.get_weights()
    checksum = float(sum(float(np.abs(w).astype("float64").sum()) for w in weights))
    if rank == 0:
        np.savez(os.path.join(job_dir, "weights.npz"), *weights)
    print(json.dumps({"final": True, "rank": rank, "checksum": checksum}), flush=True)
    return 0


def serve_ps(job_dir: str) -> int:
    """A parameter-server rank: this process hosts rank r's worker and parameter-server tasks
    (in-process ``tf.distribute.Server``s); rank 0's process is also the chief, whose
    ``ClusterCoordinator`` dispatches the steps. The other ranks serve until their task kills them.

    Long because it is one TensorFlow program run top to bottom: the servers start before anything else,
    then the chief's coordinator, the partitioned model and its steps."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import pickle

    import numpy as np

    tf = _import_tensorflow()

    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("DISTLAB_TF_THREADS", "1")))
    cfg = json.loads(os.environ["TF_CONFIG"])
    cluster = tf.train.ClusterSpec(cfg["cluster"])
    rank, world = int(cfg["task"]["index"]), len(cfg["cluster"]["worker"])
    servers = [
        tf.distribute.Server(cluster, job_name=job, task_index=rank, protocol="grpc", start=True)
        for job in ("worker", "ps")
    ]
    print(json.dumps({"serving": True, "rank": rank}), flush=True)
    if cfg["task"]["type"] != "chief":
        servers[0].join()  # until the task kills this process
        return 0
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster, task_type="chief", task_id=0, rpc_layer="grpc"
    )
    with open(os.path.join(job_dir, "job.pkl"), "rb") as f:
        job = pickle.load(f)
    partitioner = None
    shards = {tuple(k): int(n) for k, n in job.get("partition") or []}  # variable shape -> shards (axis 0)
    if shards:

        def partitioner(shape: Any, dtype: Any) -> list[int]:  # noqa: ARG001 - TensorFlow's partitioner signature
            dims = [int(d) for d in shape]
            return [min(shards.get(tuple(dims), 1), dims[0] if dims else 1)] + [1] * max(len(dims) - 1, 0)

    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    import keras

    names = _keras_names()  # the builders of the job's plain specs

    data = np.load(os.path.join(job_dir, "data.npz"))
    x, y = data["x"], data["y"]
    b = int(job["batch"])
    with strategy.scope():
        model = keras.saving.load_model(os.path.join(job_dir, "model.keras"), compile=False)
        optimizer = _optimizer(keras, job, names)
    placement = {
        v.path: [str(getattr(s, "device", "")) for s in getattr(v.value, "variables", [v.value])]
        for v in model.trainable_variables
    }  # each variable's shards, in order, and their device
    print(json.dumps({"placement": placement}), flush=True)
    if isinstance(job.get("loss"), dict):
        loss_fn = names.loss_from_spec(keras, job["loss"], per_sample=False)
    elif job.get("loss") is not None:
        loss_fn = job["loss"]
    elif np.issubdtype(y.dtype, np.integer):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        loss_fn = keras.losses.MeanSquaredError()
    seed = int(job["seed"])

    def dataset_fn():
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return ds.shuffle(min(len(x), 4096), seed=seed).batch(b, drop_remainder=True).prefetch(2)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    # partitioned variables are TensorFlow ShardedVariables, which Keras 3's optimizers cannot
    # update: their shards take plain SGD at the optimizer's rate (launch checks it is plain SGD),
    # after its weight decay as Keras applies it (var -= var * wd * lr, base_optimizer.py)
    sharded = any(hasattr(v.value, "variables") for v in model.trainable_variables)
    shard_vars = [s for v in model.trainable_variables for s in getattr(v.value, "variables", [v.value])]
    rate = float(
        optimizer.learning_rate.numpy()
        if hasattr(optimizer.learning_rate, "numpy")
        else optimizer.learning_rate
    )
    decay = getattr(optimizer, "weight_decay", None)

    metrics = job.get("metrics") or ()

    @tf.function
    def train_step(it):
        def step_fn(xb, yb):
            with tf.GradientTape() as tape:
                out = model(xb, training=True)
                loss = loss_fn(yb, out)
            values = [loss] + [
                tf.reduce_mean(tf.cast(names.metric_values(keras, m, yb, out), tf.float32)) for m in metrics
            ]
            if sharded:
                for var, g in zip(shard_vars, tape.gradient(loss, shard_vars)):
                    if decay is not None:
                        var.assign_sub(var * (float(decay) * rate))
                    var.assign_sub(rate * tf.convert_to_tensor(g))
                return values
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return values

        xb, yb = next(it)
        return strategy.run(step_fn, args=(xb, yb))

    pos = 0
    for step in range(int(job["steps"])):  # one step: one batch scheduled per worker
        t0 = time.perf_counter()
        values = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(world)]
        coordinator.join()
        t1 = time.perf_counter()
        pos += world * b
        loss, *means = np.mean([[float(f) for f in v.fetch()] for v in values], axis=0).tolist()
        print(
            json.dumps(
                {
                    "step": step,
                    "rank": 0,
                    "loss": loss,
                    "samples": pos,
                    "step_time": t1 - t0,
                    "comm_time": 0.0,
                    "wall_time": time.time(),
                    **dict(zip(metrics, means)),
                }
            ),
            flush=True,
        )
    weights = [np.asarray(w) for w in model.get_weights()]
    np.savez(os.path.join(job_dir, "weights.npz"), *weights)
    checksum = float(sum(float(np.abs(w).astype("float64").sum()) for w in weights))
    print(json.dumps({"final": True, "rank": 0, "checksum": checksum}), flush=True)
    return 0


def bench(job_dir: str) -> int:
    """``lab.calibrate(backend="tensorflow")``'s measurements on one rank, under the same
    ``MultiWorkerMirroredStrategy`` a native AllReduce run uses (``job.pkl``: ``sizes`` in bytes,
    ``repeats``, ``steps``, and ``models``: (name, per-replica batches) each, ``model{i}.keras`` and
    ``data{i}.npz`` beside it for i >= 1; model 0 is the reference model, built here). Prints one JSON line:
    per size, this rank's median seconds of one
    all-reduce; per model and batch, the median local step (no strategy, every rank stepping at
    once, as in a run); and for the reference model (``model0``) also its mirrored step, whose
    excess over local step plus all-reduce is the strategy's own cost per step.

    Long because it is one TensorFlow program run top to bottom under one strategy, created before any
    other TensorFlow op: the all-reduce sizes, then each model's steps."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import pickle

    import numpy as np

    tf = _import_tensorflow()

    tf.config.threading.set_intra_op_parallelism_threads(int(os.environ.get("DISTLAB_TF_THREADS", "1")))
    tf.config.threading.set_inter_op_parallelism_threads(1)
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=float(os.environ.get("DISTLAB_TF_TIMEOUT", "60"))
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)  # first TF op
    import keras

    with open(os.path.join(job_dir, "job.pkl"), "rb") as f:
        job = pickle.load(f)
    repeats, steps = int(job["repeats"]), int(job["steps"])

    @tf.function
    def all_reduce(t):
        return strategy.run(
            lambda t: tf.distribute.get_replica_context().all_reduce("SUM", tf.identity(t)), args=(t,)
        )

    def barrier() -> None:
        all_reduce(tf.zeros([1]))

    def median_time(fn: Any, n: int, warm: int = 2) -> float:
        for _ in range(warm):
            fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    out: dict[str, Any] = {"bench": True, "allreduce": [], "local": [], "mirrored": []}
    for nbytes in job["sizes"]:
        t = tf.ones([max(int(nbytes) // 4, 1)], tf.float32)
        barrier()
        out["allreduce"].append([int(nbytes), median_time(lambda t=t: all_reduce(t), repeats)])

    def loss_for(y: Any) -> Any:
        if np.issubdtype(y.dtype, np.integer):
            return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        return keras.losses.MeanSquaredError(reduction=None)

    def stepper(model: Any, optimizer: Any, per_sample: Any, divisor: int, replicated: bool) -> Any:
        def step_fn(xb: Any, yb: Any) -> Any:
            with tf.GradientTape() as tape:
                losses = per_sample(yb, model(xb, training=True))
                loss = tf.reduce_sum(losses) / divisor
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        if not replicated:
            return tf.function(step_fn)
        return tf.function(
            lambda xb, yb: strategy.reduce("SUM", strategy.run(step_fn, args=(xb, yb)), axis=None)
        )

    world = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    # the reference model (model0), built here: three Dense layers on 64 features, 10 classes
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    reference = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    reference.save(os.path.join(job_dir, "model0.keras"))
    np.savez(
        os.path.join(job_dir, "data0.npz"),
        x=rng.standard_normal((256, 64)).astype("float32"),
        y=rng.integers(0, 10, 256),
    )
    out["reference_bytes"] = int(sum(int(np.prod(v.shape)) * 4 for v in reference.trainable_variables))
    for i, (name, batches) in enumerate(job["models"]):
        data = np.load(os.path.join(job_dir, f"data{i}.npz"))
        x, y = data["x"], data["y"]
        path = os.path.join(job_dir, f"model{i}.keras")
        kinds = [("local", False)] + ([("mirrored", True)] if i == 0 else [])
        for kind, replicated in kinds:
            for b in batches:
                if replicated:
                    with strategy.scope():
                        model = keras.saving.load_model(path, compile=False)
                        optimizer = keras.optimizers.SGD(learning_rate=0.01)
                else:
                    model = keras.saving.load_model(path, compile=False)
                    optimizer = keras.optimizers.SGD(learning_rate=0.01)
                step = stepper(model, optimizer, loss_for(y), b * world if replicated else b, replicated)
                xb, yb = x[np.arange(b) % len(x)], y[np.arange(b) % len(x)]
                barrier()  # every rank steps at once, as in a run
                seconds = median_time(
                    lambda s=step, xb=xb, yb=yb: float(s(tf.constant(xb), tf.constant(yb))), steps, warm=3
                )
                out[kind].append([name, int(b), seconds])
        barrier()
    print(json.dumps(out), flush=True)
    return 0


def _import_tensorflow() -> Any:
    """``import tensorflow``, without the scikit-learn that TensorFlow's import of Keras pulls in for
    Keras's scikit-learn wrappers, which no rank uses: a fifth of the child's start (4.5 -> 3.6 s
    of CPU), paid by every rank of every launch. Keras tolerates its absence (the wrappers' ``import
    sklearn`` is guarded); a user's loss or optimizer can still import it afterwards."""
    blocked = "sklearn" not in sys.modules
    if blocked:
        sys.modules["sklearn"] = None  # type: ignore[assignment]  # `import sklearn` raises ImportError
    try:
        import tensorflow as tf
    finally:
        if blocked and sys.modules.get("sklearn", 0) is None:
            del sys.modules["sklearn"]
    return tf


def _optimizer(keras: Any, job: dict[str, Any], names: Any) -> Any:
    """The run's Keras optimizer: built from distlab's spec (a name, a Keras optimizer or the
    default: ``OptimizerSpec.spec()``), from the user's zero-argument factory, or SGD at 0.01."""
    opt = job.get("optimizer")
    if isinstance(opt, dict):
        return names.optimizer_from_spec(keras, opt)
    return opt() if opt else keras.optimizers.SGD(learning_rate=0.01)


def _keras_names() -> Any:
    """``distlab/keras_names.py`` loaded by its path: the Keras builders the job's plain specs name
    (``loss_from_spec``, ``optimizer_from_spec``, ``metric_values``), without importing the distlab package
    (whose import is torch's: 1.3-1.4 s of every rank's start when the job carried distlab's own
    objects) and without putting distlab's folder on ``sys.path``."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "keras_names.py"
    spec = importlib.util.spec_from_file_location("distlab_keras_names", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for_job() -> str | None:
    """A spare child (``child.py --spare``): TensorFlow imported ahead of its job, then the job
    from one line of stdin: ``{"job_dir", "stderr", "env"}`` (the variables a fresh child gets in
    its environment: ``TF_CONFIG``, ``DISTLAB_TF_*``, read after this point). Importing TensorFlow
    is about 2 s of a native rank's start here; no TensorFlow op runs before the job's strategy is
    created, so it is the same program as a fresh child's. Returns the job folder, or None when
    stdin closes first (the worker that started it has gone)."""
    _import_tensorflow()
    line = sys.stdin.readline()
    if not line.strip():
        return None
    job = json.loads(line)
    os.environ.update(job["env"])
    err = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(err, 2)  # from here on, a traceback lands in the job's log as a fresh child's does
    os.close(err)
    return job["job_dir"]


if __name__ == "__main__":
    job_dir = wait_for_job() if sys.argv[1] == "--spare" else sys.argv[1]
    if job_dir is None:
        sys.exit(0)
    mode = os.environ.get("DISTLAB_TF_MODE", "mirrored")
    sys.exit({"ps": serve_ps, "bench": bench}.get(mode, main)(job_dir))
