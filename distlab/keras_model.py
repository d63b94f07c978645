"""Keras 3 models on distlab's torch runtime: a Keras model under the torch backend, as a torch module.

Under ``KERAS_BACKEND=torch`` a Keras 3 model is a ``torch.nn.Module`` whose variables hold torch
Parameters, but its parameter names follow auto-generated layer names and ``named_modules()``
does not show its layers. ``KerasModule`` wraps it so the runtime sees what it expects: every
trainable variable registered once under its Keras path (``"sequential/dense/kernel"``), in the
order of ``model.trainable_variables``, the non-trainable ones (BatchNorm statistics) as buffers,
and ``forward`` calling the model with ``training`` set from ``module.train()/eval()``. The
registered tensors are the Keras variables' own, so an optimizer step on the module is a step of
the Keras model.

A ``KerasModule`` pickles as its ``.keras`` file (the weights included): unpickled in another
process (a Dask worker), it selects the torch backend before Keras is first imported there and
loads the file. Custom layers must be registered Keras serializables
(``@keras.saving.register_keras_serializable()``) to load.

A notebook whose Keras runs on another backend (a plain ``import keras`` selects TensorFlow) gets a
``KerasProxy`` instead: the same names, shapes and pickling (the workers still load the ``.keras``
file under torch), its tensors copies of the variables, and ``forward`` running the model on the
notebook's backend for the launch's checks (no gradients); ``load_state_dict`` loads rank 0's
trained weights into its Keras model too.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from distlab.errors import LaunchError

KERAS_ROOTS = {"keras", "tf_keras"}


def is_keras_model(obj: Any) -> bool:
    """``obj`` is a Keras model (Keras 3 or tf_keras), whatever its backend."""
    if isinstance(obj, KerasModule):
        return False
    roots = {c.__module__.split(".")[0] for c in type(obj).__mro__}
    return bool(roots & (KERAS_ROOTS | {"tensorflow"})) and hasattr(obj, "trainable_variables")


def use_torch_backend(where: str = "this process") -> Any:
    """Import Keras on the torch backend (selecting it when Keras is not imported yet); one
    ``LaunchError`` when Keras already runs on another backend here."""
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = "torch"
    try:
        import keras
    except ImportError:
        raise LaunchError(f"{where}: Keras is not installed; pip install keras (or distlab[tf])") from None
    if keras.backend.backend() != "torch":
        raise LaunchError(
            f"{where}: Keras was imported with the {keras.backend.backend()} backend, and distlab's runtime "
            "needs the torch backend; set KERAS_BACKEND=torch before the first `import keras` (restart the "
            "kernel), or use lab.launch(..., backend='tensorflow')"
        )
    return keras


def variable_names(keras_model: Any) -> dict[int, str]:
    """A name for every variable of the model (by ``id``) that survives saving and loading:
    the chain of layer names down to the layer that owns it, then its own name
    (``"dense_1/kernel"``, ``"encoder/dense/kernel"``). Keras's own ``variable.path`` does not:
    it carries the model's name only while the model built in this process lives."""
    names: dict[int, str] = {}

    def walk(layer: Any, chain: tuple[str, ...]) -> None:
        inner = list(layer._flatten_layers(include_self=False, recursive=False))
        for sub in inner:
            walk(sub, (*chain, sub.name))
        for v in [*layer.trainable_weights, *layer.non_trainable_weights]:
            names.setdefault(id(v), "/".join((*chain, str(v.name))).replace(".", "_"))

    walk(keras_model, ())
    return names


def _path(variable: Any, names: dict[int, str] | None = None) -> str:
    if names is not None and id(variable) in names:
        return names[id(variable)]
    return str(getattr(variable, "path", None) or variable.name).replace(".", "_")


@contextlib.contextmanager
def _tensorflow_unused() -> Iterator[None]:
    """Keras's saving and loading ask whether TensorFlow is importable, to recognise TensorFlow
    shape and dtype objects, and so import it (seconds and hundreds of MB per process, and its
    start-up log in the notebook's cells). A process that has not imported TensorFlow holds no
    TensorFlow object, so there the answer is no, for the duration of the call."""
    lazy = None
    if "tensorflow" not in sys.modules:
        with contextlib.suppress(ImportError, AttributeError):
            from keras.src.utils import module_utils

            lazy = module_utils.tensorflow
            if lazy._available is not None:  # asked before: its answer stands
                lazy = None
            else:
                lazy._available = False
    try:
        yield
    finally:
        if lazy is not None:
            lazy._available = None


def keras_file(keras_model: Any) -> bytes:
    """A Keras model as the bytes of its ``.keras`` file (architecture and current weights)."""
    with tempfile.TemporaryDirectory() as d, _tensorflow_unused():
        path = os.path.join(d, "model.keras")
        keras_model.save(path)
        with open(path, "rb") as f:
            return f.read()


class KerasModule(torch.nn.Module):
    """A Keras 3 model (torch backend) as the runtime's torch module: see ``distlab.keras_model``."""

    def __init__(self, keras_model: Any) -> None:
        super().__init__()
        object.__setattr__(self, "keras_model", keras_model)  # not a submodule: its own names stay hidden
        trainable, buffers = _variable_paths(keras_model)
        for name, v in zip(trainable, keras_model.trainable_variables):
            self.register_parameter(name, _torch_value(v))
        for name, v in zip(buffers, keras_model.non_trainable_variables):
            self.register_buffer(name, _torch_value(v).detach())

    @property
    def name(self) -> str:
        return str(self.keras_model.name)

    def forward(self, *inputs: Any) -> Any:
        x = inputs[0] if len(inputs) == 1 else list(inputs)
        return self.keras_model(x, training=self.training)

    def keras_file(self) -> bytes:
        """The model as a ``.keras`` file (architecture and current weights)."""
        return keras_file(self.keras_model)

    def __reduce__(self) -> Any:
        return (_from_keras_file, (self.keras_file(), self.training))

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return _from_keras_file(self.keras_file(), self.training)

    def __repr__(self) -> str:
        return f"KerasModule({self.keras_model.name}: {len(list(self.parameters()))} variables)"


def _variable_paths(keras_model: Any) -> tuple[list[str], list[str]]:
    """The registered names of a Keras model's trainable and non-trainable variables, in Keras's
    order; one ``LaunchError`` when two trainable ones share a path."""
    paths = variable_names(keras_model)
    trainable = [_path(v, paths) for v in keras_model.trainable_variables]
    if len(set(trainable)) != len(trainable):
        raise LaunchError(
            f"model: Keras model {keras_model.name} has variables of the same path {sorted(trainable)}; "
            "give its layers unique names"
        )
    return trainable, [_path(v, paths) for v in keras_model.non_trainable_variables]


def _torch_value(variable: Any) -> Any:
    value = variable.value
    if not isinstance(value, torch.Tensor):
        raise LaunchError(
            f"model: Keras variable {_path(variable)} is not a torch tensor; Keras must use the torch backend"
        )
    return value


_WRAPPED: dict[int, tuple[Any, Any]] = {}  # id(keras model) -> (weakref to it, its KerasModule)


def as_module(model: Any) -> Any:
    """``model`` itself, or for a Keras model its ``KerasModule`` (one per Keras model, so a
    relaunch finds its measured step and profile in the Lab's caches)."""
    import weakref

    if not is_keras_model(model):
        return model
    hit = _WRAPPED.get(id(model))
    if hit is not None and hit[0]() is model:
        return hit[1]
    module = wrap(model)
    _WRAPPED[id(model)] = (weakref.ref(model), module)
    return module


def wrap(keras_model: Any) -> Any:
    """A Keras model as a torch module for the runtime (see the module's docstring): a
    ``KerasModule`` where the notebook's Keras runs on torch, a ``KerasProxy`` elsewhere."""
    if "keras" not in sys.modules or sys.modules["keras"].backend.backend() == "torch":
        keras = use_torch_backend("lab.launch")
    else:
        import keras
    if not isinstance(keras_model, keras.Model):
        raise LaunchError(
            f"model: {type(keras_model).__name__} is a Keras model of another Keras "
            f"({type(keras_model).__module__}); "
            "distlab's torch runtime runs Keras 3 models (import keras)"
        )
    if not keras_model.built:
        raise LaunchError(
            f"model: Keras model {keras_model.name} is not built; call "
            "it on a batch (or give it keras.Input) first"
        )
    if keras.backend.backend() != "torch":
        return KerasProxy(keras_model)
    return KerasModule(keras_model)


def _from_keras_file(data: bytes, training: bool = True) -> Any:
    if "keras" in sys.modules and sys.modules["keras"].backend.backend() != "torch":
        return _ForeignKerasFile(data, training)
    keras = use_torch_backend(_where())
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        try:
            with _tensorflow_unused(), warnings.catch_warnings():
                # a compiled model's file holds its optimizer's state, which compile=False skips
                warnings.filterwarnings("ignore", "Skipping variable loading for optimizer")
                model = keras.saving.load_model(path, compile=False)
        except Exception as exc:  # noqa: BLE001 - a custom layer Keras cannot rebuild, among others
            raise LaunchError(
                f"model: the Keras model does not load from its .keras file in {_where()} "
                f"({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}); register custom "
                "layers with @keras.saving.register_keras_serializable() in a module the workers import"
            ) from None
    module = KerasModule(model)
    module.train(training)
    return module


class _ForeignKerasFile:
    """A ``KerasModule`` unpickled in a process whose Keras runs on another backend: the Dask
    scheduler in a notebook on TensorFlow passes it on as it came (it pickles back to the same
    file); a rank that gets one has no torch model, and using it is one ``LaunchError``."""

    def __init__(self, data: bytes, training: bool) -> None:
        self.data, self.training = data, training

    def __reduce__(self) -> Any:
        return (_from_keras_file, (self.data, self.training))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        backend = sys.modules["keras"].backend.backend() if "keras" in sys.modules else "another backend"
        raise LaunchError(
            f"model: {_where()} imported Keras on {backend} before the model arrived, and the runtime "
            "loads it under torch; a script's top-level `import keras` runs again in every worker: "
            'import keras inside `if __name__ == "__main__":`, or set KERAS_BACKEND=torch'
        )


def _where() -> str:
    try:
        from distributed import get_worker

        return f"worker {get_worker().address}"
    except (ImportError, ValueError):
        return "this process"


def unwrap(module: Any) -> Any:
    """The Keras model a ``KerasModule`` (or ``KerasProxy``) wraps; anything else as it is."""
    return module.keras_model if isinstance(module, KerasModule) else module


class KerasProxy(KerasModule):
    """A Keras 3 model on a backend other than torch, as the runtime's torch module in the
    notebook: see ``distlab.keras_model``. On the workers it is a ``KerasModule``."""

    def __init__(self, keras_model: Any) -> None:
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "keras_model", keras_model)
        self._paths, self._buffer_paths = _variable_paths(keras_model)
        for name, v in zip(self._paths, keras_model.trainable_variables):
            self.register_parameter(name, torch.nn.Parameter(_host_copy(v)))
        for name, v in zip(self._buffer_paths, keras_model.non_trainable_variables):
            self.register_buffer(name, _host_copy(v))

    def forward(self, *inputs: Any) -> Any:
        """The model's output on the notebook's backend, as a torch tensor (no gradients: the
        launch's checks read shapes and the loss's value; training runs on the workers)."""
        import numpy as np

        def host(t: Any) -> Any:
            return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t

        x = host(inputs[0]) if len(inputs) == 1 else [host(t) for t in inputs]
        out = self.keras_model(x, training=self.training)
        if isinstance(out, (list, tuple)):
            return type(out)(torch.from_numpy(np.array(o)) for o in out)
        return torch.from_numpy(np.array(out))

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """Load into the proxy's tensors and its Keras model's variables (rank 0's trained weights
        into ``run.model``)."""
        result = super().load_state_dict(state_dict, strict=strict, assign=assign)
        self._write_back()
        return result

    def _write_back(self) -> None:
        params, buffers = dict(self.named_parameters()), dict(self.named_buffers())
        for name, v in zip(self._paths, self.keras_model.trainable_variables):
            v.assign(params[name].detach().cpu().numpy())
        for name, v in zip(self._buffer_paths, self.keras_model.non_trainable_variables):
            v.assign(buffers[name].cpu().numpy())

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        import keras

        clone = keras.models.clone_model(self.keras_model)
        clone.set_weights(self.keras_model.get_weights())
        copy = KerasProxy(clone)  # its tensors from the model's weights now
        copy.train(self.training)
        return copy

    def __repr__(self) -> str:
        return f"KerasProxy({self.keras_model.name} on {_backend()}: {len(self._paths)} variables)"


def _host_copy(variable: Any) -> Any:
    import numpy as np

    return torch.as_tensor(np.array(variable.numpy() if hasattr(variable, "numpy") else variable))


def _backend() -> str:
    import keras

    return str(keras.backend.backend())
