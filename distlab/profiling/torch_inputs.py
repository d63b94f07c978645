"""Inputs for profiling a torch model: per-sample specs, synthetic batches, and what went wrong when a forward
fails."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from distlab.errors import ProfileError

DEFAULT_TOKENS = 16  # sequence length given to a model whose first layer is an embedding
DEFAULT_SPATIAL = {1: (64,), 2: (32, 32), 3: (16, 16, 16)}  # conv input size by dimension

Batch = tuple[torch.Tensor, ...]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def spec_of(sample: torch.Tensor) -> dict[str, Any]:
    """Per-sample spec of a batch tensor: its shape without the batch dimension, dtype, and ``high`` for
    ints."""
    spec: dict[str, Any] = {"shape": list(sample.shape[1:]), "dtype": dtype_name(sample.dtype)}
    if not sample.is_floating_point() and not sample.is_complex() and sample.numel():
        spec["high"] = int(sample.max()) + 1
    return spec


def tensor_from_spec(
    spec: dict[str, Any], n: int, generator: torch.Generator, device: Any = "cpu"
) -> torch.Tensor:
    """``n`` random samples of ``spec`` (floats ~ N(0, 1), ints uniform in ``[0, high)``)."""
    try:
        shape = (n, *(int(d) for d in spec["shape"]))
        dtype = getattr(torch, str(spec.get("dtype", "float32")))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ProfileError(
            f"input_spec: expected {{'shape': [...], 'dtype': 'float32'|'int64'}}, got {spec!r}"
        ) from None
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=dtype).to(device)
    high = int(spec.get("high", 2))
    return torch.randint(0, high, shape, generator=generator, dtype=dtype).to(device)


def _first_leaf(model: nn.Module) -> tuple[str, nn.Module]:
    for name, mod in model.named_modules():
        if not any(True for _ in mod.children()):
            return name, mod
    return "", model


def infer_input_spec(model: nn.Module) -> dict[str, Any]:
    """The per-sample input a model declares (``model.input_spec``) or its first layer fixes."""
    spec = getattr(model, "input_spec", None)
    cls = type(model).__name__
    if spec is not None:
        if not isinstance(spec, dict) or "shape" not in spec:
            raise ProfileError(
                f"{cls}.input_spec: expected one sample's {{'shape': [...], 'dtype': 'float32'|'int64'}} "
                f"(no batch dimension; 'high': N for integer ids), e.g. {{'shape': [1, 8, 8], 'dtype': "
                f"'float32'}}, got {spec!r}"
            )
        return dict(spec)
    name, first = _first_leaf(model)
    if isinstance(first, nn.Linear):
        return {"shape": [first.in_features], "dtype": "float32"}
    if isinstance(first, (nn.Embedding, nn.EmbeddingBag)):
        return {"shape": [DEFAULT_TOKENS], "dtype": "int64", "high": first.num_embeddings}
    if isinstance(first, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        dims = len(first.kernel_size)
        return {"shape": [first.in_channels, *DEFAULT_SPATIAL[dims]], "dtype": "float32"}
    where = f"first layer {name} is {type(first).__name__}" if name else "it has no layers"
    raise ProfileError(
        f"sample_input: cannot infer the input shape of {cls} ({where}); pass sample_input=a batch it "
        "accepts (in a magic: --sample-input VAR or --data VAR)"
    )


def make_batcher(
    model: nn.Module, sample_input: Any, device: Any, seed: int = 0
) -> tuple[Callable[[int], Batch], Any, bool]:
    """``(batch(n) -> args, input_spec, inferred)`` for the profiled model.

    A given sample is tiled along its batch dimension (so integer indices stay valid);
    otherwise inputs are drawn from the inferred spec.
    """
    if sample_input is None:
        spec = infer_input_spec(model)
        gen = torch.Generator().manual_seed(seed)
        pool = tensor_from_spec(spec, 64, gen, device)
        return (lambda n: (_tile(pool, n),)), spec, True
    samples = tuple(sample_input) if isinstance(sample_input, (tuple, list)) else (sample_input,)
    for i, t in enumerate(samples):
        if not isinstance(t, torch.Tensor):
            where = "sample_input" if len(samples) == 1 else f"sample_input[{i}]"
            raise ProfileError(
                f"{where}: expected a torch.Tensor with a batch dimension, got {type(t).__name__}"
            )
        if t.dim() == 0 or t.shape[0] == 0:
            raise ProfileError(
                f"sample_input: expected a batch (first dimension >= 1), got shape {list(t.shape)}"
            )
    samples = tuple(t.detach().to(device) for t in samples)
    spec: Any = spec_of(samples[0]) if len(samples) == 1 else [spec_of(t) for t in samples]
    return (lambda n: tuple(_tile(t, n) for t in samples)), spec, False


def _tile(t: torch.Tensor, n: int) -> torch.Tensor:
    idx = torch.arange(n, device=t.device) % t.shape[0]
    return t.index_select(0, idx)


def _shape(x: torch.Tensor) -> str:
    """A batch's shape with its (micro-)batch dimension written as ``batch``."""
    dims = [str(d) for d in x.shape]
    return "[" + ", ".join(["batch", *dims[1:]] if len(dims) > 1 else dims) + "]"


def diagnose(layer: str, module: nn.Module | None, args: Any, exc: BaseException) -> str:
    """One line naming the failing layer and, for Linear/Conv/Embedding, the expected against the given
    input."""
    kind = type(module).__name__ if module is not None else "model"
    where = f"forward: layer {layer!r} ({kind})" if layer else f"forward: {kind}"
    x = args[0] if isinstance(args, tuple) and args and isinstance(args[0], torch.Tensor) else None
    if (
        x is not None
        and isinstance(module, nn.Linear)
        and (x.dim() == 0 or x.shape[-1] != module.in_features)
    ):
        return (
            f"{where} expects inputs whose last dimension is {module.in_features} (in_features), "
            f"got shape {_shape(x)}"
        )
    if x is not None and isinstance(module, nn.modules.conv._ConvNd):
        nd = len(module.kernel_size)
        if x.dim() not in (nd + 1, nd + 2):
            return (
                f"{where} expects a {nd + 2}-d input (batch, {module.in_channels} channels, {nd} spatial), "
                f"got shape {_shape(x)}"
            )
        if x.shape[-nd - 1] != module.in_channels:
            return (
                f"{where} expects {module.in_channels} input channels at dim {-nd - 1}, got shape {_shape(x)}"
            )
    if x is not None and isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        if x.is_floating_point():
            return f"{where} expects int64 indices, got {dtype_name(x.dtype)} of shape {_shape(x)}"
        if x.numel() and (int(x.max()) >= module.num_embeddings or int(x.min()) < 0):
            return f"{where} has {module.num_embeddings} rows, got index {int(x.max())}"
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{where} failed: {type(exc).__name__}: {msg}"[:400]
