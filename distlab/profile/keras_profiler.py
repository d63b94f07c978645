"""A minimal profile of a Keras model: variables, layers with parameter counts, and the measured step time."""

from __future__ import annotations

import statistics
import time
from typing import Any

from distlab.errors import ProfileError
from distlab.profile.model_profile import LayerProfile, ModelProfile, VariableProfile, dtype_bytes


def profile_keras(
    model: Any, sample_input: Any, batch_size: int, *, repeats: int = 3, warmup: int = 1
) -> ModelProfile:
    """Profile a ``keras.Model``. FLOPs and per-layer times are not measured (zeros); the step time is.

    Embedding tables are marked sparse: TensorFlow hands their gradients over as ``IndexedSlices``.
    """
    import numpy as np
    import tensorflow as tf

    name = getattr(model, "name", type(model).__name__)
    if sample_input is None:
        if not getattr(model, "built", False) or not getattr(model, "inputs", None):
            raise ProfileError(
                f"sample_input: cannot infer the input of Keras model {name}; pass sample_input=np.zeros((batch, ...))"
            )
        shape = [int(d or 1) for d in model.inputs[0].shape[1:]]
        sample_input = np.zeros([1, *shape], dtype=model.inputs[0].dtype or "float32")
    x = np.asarray(sample_input)
    x = x[np.arange(batch_size) % len(x)]
    model(x[:1])  # builds the variables
    owner: dict[int, Any] = {}
    for layer in _leaf_layers(model):
        for v in layer.trainable_weights:
            owner.setdefault(id(v), layer)
    if not model.trainable_variables:
        raise ProfileError(f"profile: {name} has no trainable parameters, so there is nothing to distribute")
    variables = []
    for v in model.trainable_variables:
        layer = owner.get(id(v))
        is_emb = layer is not None and type(layer).__name__ == "Embedding"
        dtype = str(getattr(v.dtype, "name", v.dtype))
        shape = tuple(int(d) for d in v.shape)
        variables.append(
            VariableProfile(
                name=str(getattr(v, "path", None) or v.name),
                shape=shape,
                dtype=dtype,
                nbytes=int(np.prod(shape)) * dtype_bytes(dtype),
                sparse=is_emb,
                embedding=is_emb,
                layer=layer.name if layer is not None else name,
            )
        )
    layers = tuple(
        LayerProfile(name=layer.name, kind=type(layer).__name__, params=int(layer.count_params()))
        for layer in _leaf_layers(model)
    )

    def step() -> float:
        t0 = time.perf_counter()
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(model(x, training=True), tf.float32))
        tape.gradient(loss, model.trainable_variables)
        return time.perf_counter() - t0

    try:
        for _ in range(warmup):
            step()
        step_time = statistics.median(step() for _ in range(repeats))
    except Exception as exc:  # the user's model failed on the sample
        raise ProfileError(
            f"forward: Keras model {name} failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
        ) from None
    spec = {"shape": list(x.shape[1:]), "dtype": str(x.dtype)}
    if x.dtype.kind in "iu":
        spec["high"] = int(x.max()) + 1
    return ModelProfile(
        variables=tuple(variables),
        layers=layers,
        batch_size=batch_size,
        name=name,
        input_spec=spec,
        step_time=step_time,
        meta={"framework": "keras", "flops": "not measured", "repeats": repeats, "warmup": warmup},
    )


def _leaf_layers(model: Any) -> list[Any]:
    out = []
    for layer in getattr(model, "layers", []):
        inner = getattr(layer, "layers", None)
        out.extend(_leaf_layers(layer) if inner else [layer])
    return out
