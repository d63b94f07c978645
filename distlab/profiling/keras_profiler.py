"""The profile of a Keras 3 model, under the TensorFlow or the torch backend: the same ModelProfile
as for a torch module.

- Variables: every trainable variable by its Keras path, in ``model.trainable_variables`` order.
  Embedding tables are ``embedding``; under TensorFlow they are also ``sparse`` (their gradients
  are ``tf.IndexedSlices``), under torch their gradients are dense, as the torch runtime moves them.
- Layers: every leaf layer in call order, its parameters, and FLOPs counted from the shapes one
  forward pass records (2 per multiply-add): Dense 2·B·in·out, convolutions
  2·outputs·kernel·in_channels/groups, EinsumDense from its equation, recurrent layers per time
  step, Embedding 0; other layers one FLOP per output element. Backward counts twice the forward
  for layers with weights (gradients of inputs and weights), once for the others.
- Times: the median of ``repeats`` measured training steps (forward, a loss, the gradients of
  every variable) at ``batch_size``, split over the layers in proportion to their FLOPs
  (``meta["layer_times"] = "split by FLOPs"``): Keras hides per-op attribution behind its
  backends, so the per-layer times are shares, the step time is measured.
- Gradient-ready order: the variables of the last-called layer first.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import numpy as np

from distlab.errors import ProfileError
from distlab.profiling.model_profile import LayerProfile, ModelProfile, VariableProfile, dtype_bytes


def profile_keras(
    model: Any, sample_input: Any, batch_size: int, *, repeats: int = 3, warmup: int = 1
) -> ModelProfile:
    """Profile a Keras 3 model (see the module's docstring)."""
    import keras

    for label, value, low in (("batch_size", batch_size, 1), ("repeats", repeats, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ProfileError(f"profile: {label} must be an integer >= {low}, got {value!r}")
    if not isinstance(model, keras.Model):
        raise ProfileError(
            f"profile: {type(model).__name__} is not a Keras 3 model (keras.Model); tf_keras models are not "
            "supported"
        )
    name = model.name
    backend = keras.backend.backend()
    x = _batch(model, sample_input, batch_size)
    layers = _leaf_layers(model)
    shapes = _record_shapes(model, layers, x)
    if not model.trainable_variables:
        raise ProfileError(f"profile: {name} has no trainable parameters, so there is nothing to distribute")
    from distlab.keras_model import variable_names

    paths = variable_names(model)
    variables = _variables(model, layers, paths, backend)
    step_time = _step_time(model, x, backend, repeats, warmup)
    rows = _layer_rows(layers, shapes, step_time)
    order = _ready_order(layers, shapes, paths, variables)
    from distlab.zoo import keras_specs

    spec: dict[str, Any] = {"shape": list(x.shape[1:]), "dtype": str(x.dtype)}
    if x.dtype.kind in "iu":
        spec["high"] = int(x.max()) + 1
    target = None
    zoo = keras_specs(model)
    if zoo is not None:  # a zoo model: the specs synthetic data are drawn from
        spec, target = zoo
    return ModelProfile(
        variables=tuple(variables),
        layers=tuple(rows),
        batch_size=batch_size,
        grad_ready_order=tuple(order),
        name=name,
        input_spec=spec,
        target_spec=target,
        step_time=step_time,
        meta={
            "framework": "keras",
            "backend": backend,
            "flops": "counted from layer shapes",
            "layer_times": "split by FLOPs",
            "repeats": repeats,
            "warmup": warmup,
        },
    )


def _variables(model: Any, layers: list[Any], paths: dict[int, str], backend: str) -> list[VariableProfile]:
    """Each trainable variable, named by its path; an Embedding's sparse where its gradient is
    (``tf.IndexedSlices`` under TensorFlow; dense under torch)."""
    import keras

    owner = {id(v): layer for layer in layers for v in layer.trainable_weights}
    variables = []
    for v in model.trainable_variables:
        layer = owner.get(id(v))
        is_emb = layer is not None and isinstance(layer, keras.layers.Embedding)
        dtype = str(getattr(v.dtype, "name", v.dtype))
        shape = tuple(int(d) for d in v.shape)
        variables.append(
            VariableProfile(
                name=paths.get(id(v), _var_name(v)),
                shape=shape,
                dtype=dtype,
                nbytes=int(np.prod(shape)) * dtype_bytes(dtype),
                sparse=is_emb and backend == "tensorflow",
                embedding=is_emb,
                layer=layer.name if layer is not None else model.name,
            )
        )
    return variables


def _layer_rows(layers: list[Any], shapes: dict[int, Any], step_time: float) -> list[LayerProfile]:
    """Each leaf layer's FLOPs from its shapes, and its share of the measured step split by them."""
    flops = [layer_flops(layer, *shapes.get(id(layer), ((), ()))) for layer in layers]
    total = sum(max(f, 1.0) for f in flops)
    rows = []
    for layer, f in zip(layers, flops, strict=True):
        weighted = bool(layer.trainable_weights)
        share = max(f, 1.0) / total * step_time  # forward + backward seconds of this layer
        rows.append(
            LayerProfile(
                name=layer.name,
                kind=type(layer).__name__,
                params=int(sum(int(np.prod(w.shape)) for w in layer.trainable_weights)),
                flops_fwd=float(f),
                flops_bwd=float(2 * f if weighted else f),
                time_fwd=share / 3,
                time_bwd=share * 2 / 3,
                activation_bytes=int(np.prod(shapes.get(id(layer), ((), (0,)))[1] or (0,))) * 4,
            )
        )
    return rows


def _ready_order(
    layers: list[Any], shapes: dict[int, Any], paths: dict[int, str], variables: list[VariableProfile]
) -> list[str]:
    """Variables in the order backward makes their gradients ready: the called layers last first."""
    called = [layer for layer in layers if id(layer) in shapes]
    order = [
        paths.get(id(v), _var_name(v))
        for layer in reversed(called)
        for v in reversed(layer.trainable_weights)
    ]
    names = [v.name for v in variables]
    order = [n for n in dict.fromkeys(order) if n in names]
    order += [n for n in reversed(names) if n not in order]
    return order


def _var_name(v: Any) -> str:
    return str(v.path).replace(".", "_")


def _batch(model: Any, sample_input: Any, batch_size: int) -> np.ndarray:
    """``batch_size`` samples of the sample input (repeated), or zeros of the model's input shape."""
    if sample_input is None:
        inputs = getattr(model, "inputs", None) if getattr(model, "built", False) else None
        if not inputs:
            raise ProfileError(
                f"sample_input: cannot infer the input of Keras model {model.name}; pass "
                "sample_input=np.zeros((batch, ...))"
            )
        shape = [int(d or 1) for d in inputs[0].shape[1:]]
        sample_input = np.zeros([1, *shape], dtype=str(inputs[0].dtype or "float32"))
    x = np.asarray(sample_input.cpu() if hasattr(sample_input, "cpu") else sample_input)
    if x.ndim == 0 or len(x) == 0:
        raise ProfileError("sample_input: needs a batch dimension with at least one sample")
    return x[np.arange(batch_size) % len(x)]


def _leaf_layers(model: Any) -> list[Any]:
    """Layers without sub-layers, depth first (a MultiHeadAttention gives its projections)."""
    out = []
    for layer in getattr(model, "layers", None) or model._flatten_layers(include_self=False, recursive=False):
        inner = list(layer._flatten_layers(include_self=False, recursive=False))
        out.extend(_leaf_layers(layer) if inner else [layer])
    return out


def _record_shapes(model: Any, layers: list[Any], x: np.ndarray) -> dict[int, tuple[tuple, tuple]]:
    """One forward pass that records each leaf layer's (input shape, output shape), in call order."""
    shapes: dict[int, tuple[tuple, tuple]] = {}
    originals = {}

    def wrap(layer: Any) -> Any:
        call = layer.call

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = call(*args, **kwargs)
            first = args[0] if args else next(iter(kwargs.values()), None)
            result = out[0] if isinstance(out, (tuple, list)) else out
            shapes.setdefault(id(layer), (_shape(first), _shape(result)))
            return out

        return recorded

    for layer in layers:
        originals[id(layer)] = layer
        layer.call = wrap(layer)
    try:
        model(x, training=False)
    except Exception as exc:  # noqa: BLE001 - the user's model failed on the sample
        raise ProfileError(
            f"forward: Keras model {model.name} failed on sample_input {tuple(x.shape)}: "
            f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        ) from None
    finally:
        for layer in layers:
            if "call" in vars(layer):
                del layer.call
    return shapes


def _shape(t: Any) -> tuple:
    s = getattr(t, "shape", None)
    return tuple(int(d) if d is not None else 1 for d in s) if s is not None else ()


def layer_flops(layer: Any, in_shape: tuple, out_shape: tuple) -> float:
    """Forward FLOPs of one call of ``layer`` (2 per multiply-add) from its input and output shapes."""
    kind = type(layer).__name__
    out_elems = float(math.prod(out_shape)) if out_shape else 0.0
    if kind == "Embedding" or not out_shape:
        return 0.0
    if kind == "Dense":
        fan_in = int(layer.kernel.shape[0])
        return 2.0 * out_elems * fan_in
    if kind == "EinsumDense":  # every index of the equation once: 2 x the product of their sizes
        lhs = layer.equation.split("->")[0].split(",")
        sizes: dict[str, int] = {}
        for letters, dims in ((lhs[0], in_shape), (lhs[1], tuple(int(d) for d in layer.kernel.shape))):
            for letter, d in zip(
                letters.replace("...", ""), dims[-len(letters.replace("...", "")) :], strict=False
            ):
                sizes[letter] = int(d)
        extra = (
            math.prod(in_shape[: len(in_shape) - len(lhs[0].replace("...", ""))]) if "..." in lhs[0] else 1
        )
        return 2.0 * float(math.prod(sizes.values())) * extra
    if kind.startswith("Conv") and hasattr(layer, "kernel"):
        k = [int(d) for d in layer.kernel.shape]  # (*spatial, in/groups, out)
        if "Transpose" in kind:
            return 2.0 * float(math.prod(in_shape)) * math.prod(k[:-2]) * k[-1]
        return 2.0 * out_elems * math.prod(k[:-2]) * k[-2]
    if kind in ("LSTM", "GRU", "SimpleRNN") and hasattr(layer, "cell"):
        gates = {"LSTM": 4, "GRU": 3, "SimpleRNN": 1}[kind]
        units, fan_in = int(layer.cell.units), int(in_shape[-1])
        batch, steps = int(in_shape[0]), int(in_shape[1]) if len(in_shape) > 2 else 1
        return 2.0 * gates * units * (fan_in + units) * batch * steps
    return out_elems


def _step_time(model: Any, x: np.ndarray, backend: str, repeats: int, warmup: int) -> float:
    """Median seconds of a training step's computation: forward, a scalar loss, every gradient."""
    if backend == "torch":
        import torch

        xt = torch.as_tensor(x)

        def step() -> float:
            t0 = time.perf_counter()
            out = model(xt, training=True)
            out = out[0] if isinstance(out, (tuple, list)) else out
            loss = out.float().sum()
            grads = torch.autograd.grad(loss, [v.value for v in model.trainable_variables], allow_unused=True)
            del grads
            return time.perf_counter() - t0

    elif backend == "tensorflow":
        import tensorflow as tf

        def step() -> float:
            t0 = time.perf_counter()
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                out = out[0] if isinstance(out, (tuple, list)) else out
                loss = tf.reduce_sum(tf.cast(out, tf.float32))
            tape.gradient(loss, model.trainable_variables)
            return time.perf_counter() - t0

    else:
        raise ProfileError(f"profile: Keras backend {backend!r} is not supported; use tensorflow or torch")
    try:
        for _ in range(warmup):
            step()
        return statistics.median(step() for _ in range(repeats))
    except Exception as exc:  # noqa: BLE001 - the user's model failed on the sample
        raise ProfileError(
            f"forward: Keras model {model.name} failed in a training step: {type(exc).__name__}: "
            f"{str(exc).strip()[:300]}"
        ) from None
