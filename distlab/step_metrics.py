"""What a run reports beside its loss at every step: the metrics of a Keras model's
``compile(metrics=[...])``, as Keras's ``fit`` logs them.

A metric is named as Keras names it (``"accuracy"``, ``"sparse_categorical_accuracy"``,
``"mae"``, a ``keras.metrics.SparseCategoricalAccuracy()`` object ...) and computed on each rank's
training batch of the step, before the update, as ``fit`` computes its training metrics: on the
torch route in torch (:meth:`StepMetric.__call__`), natively in the TensorFlow child with
Keras's own functions (``keras_names.metric_values``). Each becomes a column of ``run.metrics`` (one
value per rank and step; the mean over ranks is the global batch's, every rank's batch being the
same size), and the Run card shows the last step's. ``"accuracy"`` is resolved from the shapes
as Keras resolves it: integer targets one rank below the output are class ids
(``sparse_categorical_accuracy``), targets shaped like a one-column output are 0/1 labels
(``binary_accuracy``), like a wider output one-hot rows (``categorical_accuracy``).

A metric distlab does not compute (a custom function, AUC, precision ...) is left out with one
warning naming it; the run trains all the same.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

from distlab.errors import DistlabWarning
from distlab.keras_names import metric_kind as resolved  # one definition: the TensorFlow child's too

METRICS = (
    "accuracy",
    "sparse_categorical_accuracy",
    "categorical_accuracy",
    "binary_accuracy",
    "mean_absolute_error",
    "mean_squared_error",
)
_ALIASES = {"acc": "accuracy", "mae": "mean_absolute_error", "mse": "mean_squared_error"}
_ALIASES.update({name.replace("_", ""): name for name in METRICS})  # class names, lower-cased


@dataclasses.dataclass(frozen=True)
class StepMetric:
    """A Keras metric by canonical ``name``; ``metric(output, target)`` is its value on a batch."""

    name: str

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> float:
        with torch.no_grad():
            out, y = output.detach().float(), target.detach()
            kind = resolved(self.name, tuple(out.shape), tuple(y.shape), not y.is_floating_point())
            if kind == "sparse_categorical_accuracy":
                hit = out.argmax(-1) == y.reshape(out.shape[:-1]).long()
            elif kind == "categorical_accuracy":
                hit = out.argmax(-1) == y.argmax(-1)
            elif kind == "binary_accuracy":
                hit = (out > 0.5) == (y.reshape(out.shape).float() > 0.5)
            elif kind == "mean_absolute_error":
                return float((out - y.float().reshape(out.shape)).abs().mean())
            else:
                return float(((out - y.float().reshape(out.shape)) ** 2).mean())
            return float(hit.float().mean())


def step_metrics(model: Any) -> tuple[StepMetric, ...]:
    """The metrics of a compiled Keras ``model`` (a ``KerasModule`` or the model itself) that
    distlab computes; none for anything else. Each one it does not: one warning."""
    inner = getattr(model, "keras_model", model)
    given = _compiled(inner)
    out: list[StepMetric] = []
    for m in given:
        name = _name(m)
        if name is None:
            warnings.warn(
                f"metrics: {_label(m)} from model.compile is not one distlab computes per step "
                f"({', '.join(METRICS)}); the run reports the loss without it",
                DistlabWarning,
                stacklevel=3,
            )
        elif StepMetric(name) not in out:
            out.append(StepMetric(name))
    return tuple(out)


def _compiled(model: Any) -> list[Any]:
    """``compile``'s metrics as given (Keras 3 keeps them on its compile-metrics container)."""
    container = getattr(model, "_compile_metrics", None)
    given = getattr(container, "_user_metrics", None)
    if given is None:
        return []
    if isinstance(given, dict):  # one list per output: distlab's models have one output
        given = [m for ms in given.values() for m in (ms if isinstance(ms, (list, tuple)) else [ms])]
    return list(given) if isinstance(given, (list, tuple)) else [given]


def _name(metric: Any) -> str | None:
    """The canonical name of a Keras metric given as a name, a function or a metric object."""
    if isinstance(metric, str):
        key = metric
    elif isinstance(metric, type(_name)):  # a function: keras.metrics.sparse_categorical_accuracy
        key = metric.__name__
    else:  # a metric object: keras.metrics.SparseCategoricalAccuracy()
        key = type(metric).__name__
    key = key.lower()
    key = _ALIASES.get(key, _ALIASES.get(key.replace("_", ""), key))
    return key if key in METRICS else None


def _label(metric: Any) -> str:
    return repr(metric) if isinstance(metric, str) else getattr(metric, "__name__", type(metric).__name__)


def describe(metrics: tuple[StepMetric, ...]) -> str:
    """The card's words for the run's metrics."""
    return ", ".join(m.name for m in metrics) + " from model.compile" if metrics else ""
