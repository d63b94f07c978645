"""Keras losses, optimizers and metrics as plain data names them: the one place both routes build
them from. The native route's TensorFlow child loads this file by its path
(``native_tf/child.py``'s ``_keras_names``): it imports nothing, so a job of plain specs
(``KerasLoss.spec()``, ``OptimizerSpec.spec()``, a metric's name) unpickles there without the
distlab package, whose import is torch's; ``conventions`` and ``step_metrics`` build from it too."""

from __future__ import annotations

from typing import Any


def loss_from_spec(keras: Any, spec: dict[str, Any], per_sample: bool = True) -> Any:
    """The Keras loss ``{"keras_loss": class name, "options": {...}}`` (``KerasLoss.spec()``): per
    sample (``reduction=None``), or averaged over the batch as Keras averages by default."""
    reduction = {"reduction": None} if per_sample else {}
    return getattr(keras.losses, spec["keras_loss"])(**spec["options"], **reduction)


def optimizer_from_spec(keras: Any, spec: dict[str, Any]) -> Any:
    """The Keras optimizer ``{"keras_optimizer": class name, "settings": {...}}``
    (``OptimizerSpec.spec()``)."""
    return getattr(keras.optimizers, spec["keras_optimizer"])(**spec["settings"])


def metric_kind(name: str, out: tuple[int, ...], target: tuple[int, ...], integer: bool) -> str:
    """``"accuracy"`` as Keras resolves it for these shapes; any other name as it is."""
    if name != "accuracy":
        return name
    if integer and len(target) < len(out) or (len(target) == len(out) and target[-1:] == (1,) != out[-1:]):
        return "sparse_categorical_accuracy"
    return "binary_accuracy" if out[-1:] == (1,) else "categorical_accuracy"


def metric_values(keras: Any, name: str, y_true: Any, y_pred: Any) -> Any:
    """Per-sample values of the metric ``name`` with Keras's own functions."""
    kind = metric_kind(name, tuple(y_pred.shape), tuple(y_true.shape), not y_true.dtype.is_floating)
    fn = {
        "sparse_categorical_accuracy": keras.metrics.sparse_categorical_accuracy,
        "categorical_accuracy": keras.metrics.categorical_accuracy,
        "binary_accuracy": keras.metrics.binary_accuracy,
        "mean_absolute_error": keras.losses.mean_absolute_error,
        "mean_squared_error": keras.losses.mean_squared_error,
    }[kind]
    return fn(y_true, y_pred)
