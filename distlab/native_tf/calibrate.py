"""``lab.calibrate(backend="tensorflow")``: TensorFlow's side of the cluster, for native predictions.

One TensorFlow process per worker (``native_tf/child.py`` in ``bench`` mode, started and killed by
its rank's pinned Dask task, as a native run's are: ``launch/tf_rank.bench_rank_tf``) under
``MultiWorkerMirroredStrategy`` measures its all-reduce at ``SIZES``, a reference Keras model's
step locally and under the strategy, and each Keras model in ``models=`` stepping locally with
every rank busy at ``batch_size`` and a quarter of it. ``costmodel/native.py`` fits and predicts.

Cached per cluster and TensorFlow version in ``lab.cache_dir`` (``native-*.json``); a model measured
before is not measured again. Under load from other programs the figures serve this session only.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distlab.errors import CalibrationError, LaunchError, check_positive
from distlab.files import write_atomic

if TYPE_CHECKING:
    from distlab.cluster.cluster import Cluster
    from distlab.costmodel.model import CostModel

SIZES = (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20)  # bytes of one all-reduce
REPEATS, STEPS = 10, 20  # timed all-reduces per size; timed local steps per model and batch
REFERENCE = ("reference", 32)  # the child's reference model and its per-replica batch
DATA_ROWS = 512  # rows of each model's data shipped to the workers


def _tf_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        try:
            return metadata.version("tensorflow-cpu")
        except metadata.PackageNotFoundError:
            raise CalibrationError(
                "calibrate(backend='tensorflow'): TensorFlow is not installed; pip install 'distlab[tf]'"
            ) from None


def _cases(models: Any, batch_size: int) -> list[tuple[str, str, Any, Any, Any, list[int]]]:
    """(name, key, model, x, y, batches) per Keras model; one error naming a model that is not one."""
    import distlab as dl
    from distlab.calibration.campaign import keras_zoo_data
    from distlab.costmodel.compute import model_key
    from distlab.keras_model import is_keras_model
    from distlab.native_tf.launch import arrays

    check_positive("calibrate: batch_size", batch_size, CalibrationError)
    batches = sorted({batch_size, max(1, batch_size // 4)})
    out = []
    for i, item in enumerate(models if isinstance(models, (list, tuple)) else [models]):
        model, data = (item[0], item[1]) if isinstance(item, tuple) and len(item) >= 2 else (item, None)
        if not is_keras_model(model):
            raise CalibrationError(
                f"calibrate(backend='tensorflow'): models[{i}] is a {type(model).__name__}; natively "
                "TensorFlow runs Keras models: pass Keras models (or (keras_model, (x, y)) pairs)"
            )
        if data is None:
            data = keras_zoo_data(model, DATA_ROWS)
        if data is None:
            raise CalibrationError(
                f"calibrate(backend='tensorflow'): models[{i}] ({model.name}) needs data: pass (model, (x, "
                "y))"
            )
        x, y = arrays(data)
        x, y = x[:DATA_ROWS], y[:DATA_ROWS]
        key = model_key(dl.profile(model, sample_input=x[: max(batches)]))
        out.append((f"model{i + 1}", key, model, x, y, batches))
    return out


def calibrate_native(
    cluster: Cluster,
    cache_dir: Path,
    cm: CostModel | None,
    models: Any = (),
    batch_size: int = 32,
    cache: bool = True,
    progress: bool = True,
) -> Any:
    """``cm`` (the default model when None) plus ``NativeParams`` measured on ``cluster``, cached in
    ``cache_dir`` (see module docstring)."""
    from distlab.calibration.campaign import cache_key
    from distlab.calibration.measure import Progress
    from distlab.cluster.load import LoadMonitor, warn_disturbed
    from distlab.costmodel import CostModel
    from distlab.costmodel.native import fit_native
    from distlab.keras_model import keras_file
    from distlab.native_tf.rank import bench_rank_tf

    cm = cm if cm is not None else CostModel.default()
    version = _tf_version()
    cases = _cases(models or (), batch_size)
    res = cluster.resources
    if res.world < 2:
        raise CalibrationError(
            f"calibrate(backend='tensorflow'): the Lab has {res.world} worker; collectives need 2 or more "
            "(Lab(workers=2))"
        )
    path = Path(cache_dir) / f"native-{cache_key(res, None)}-tf{version}.json"
    cached = _read_cached(path) if cache else None
    todo = [c for c in cases if cached is None or not all(b in cached.local.get(c[1], {}) for b in c[5])]
    if cached is not None and not todo:
        return cm.with_native(cached)
    import cloudpickle

    job = {
        "sizes": list(SIZES),
        "repeats": REPEATS,
        "steps": STEPS,
        "models": [(REFERENCE[0], [REFERENCE[1]])] + [(name, batches) for name, _, _, _, _, batches in todo],
    }
    # a TensorFlow start (~10 s), the sizes, and a compiled step per model and batch
    deadline = 60.0 + 15.0 * sum(len(c[5]) for c in todo) + cluster.timeout
    payload = {
        "job": cloudpickle.dumps(job),
        "deadline": deadline,
        "models": [(keras_file(m), x, y) for _, _, m, x, y, _ in todo],
    }
    bar = Progress(1, f"calibrating TensorFlow on {res.world} ranks", progress)
    bar.start(f"all-reduce and {len(todo) + 1} model step(s) under MultiWorkerMirroredStrategy")
    monitor = LoadMonitor(cluster.client).start()
    try:
        out = cluster.run_ranks(
            bench_rank_tf, payload, uuid.uuid4().hex[:8], cluster.timeout, timeout=deadline + cluster.timeout
        )
    except LaunchError as exc:
        raise CalibrationError(f"calibrate(backend='tensorflow'): {exc}") from None
    finally:
        bar.done()
        bar.close()
    ref_bytes = int(out[0]["reference_bytes"])
    native = fit_native(out, (REFERENCE[0], REFERENCE[1], ref_bytes), {c[0]: c[1] for c in todo}, version)
    if cached is not None:
        native = cached.with_local(native.local)  # the cluster's figures as first measured, more models
    disturbed = warn_disturbed(
        "calibrate(backend='tensorflow')",
        monitor.stop(),
        "these figures describe that load: used for this session only, not cached",
    )
    if cache and not disturbed:
        write_atomic(path, json.dumps(native.to_dict(), indent=1))
    return cm.with_native(native)


def _read_cached(path: Path) -> Any:
    """The cached NativeParams at ``path``; None when absent or unreadable (measured again and
    overwritten)."""
    from distlab.costmodel.native import NativeParams

    if not path.exists():
        return None
    try:
        return NativeParams.from_dict(json.loads(path.read_text()))
    except (CalibrationError, ValueError, OSError):
        return None
