"""Data sets for the zoo: learnable synthetic generators per model, generic ones from a spec, and
scikit-learn's digits.

Every data set yields ``(input, target)`` pairs of one sample each, matching the model's
``input_spec``/``target_spec``, and is deterministic from ``seed``. Data cards: ``datasets/README.md``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.data import Dataset

from distlab.errors import DistlabError


class TensorPairs(Dataset):
    """``(inputs[i], targets[i])`` pairs held in two tensors, with the specs they follow."""

    def __init__(
        self,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        name: str = "synthetic",
        input_spec: dict[str, Any] | None = None,
        target_spec: dict[str, Any] | None = None,
    ) -> None:
        if len(inputs) != len(targets):
            raise DistlabError(f"{name}: {len(inputs)} inputs but {len(targets)} targets")
        self.inputs, self.targets, self.name = inputs, targets, name
        self.input_spec = input_spec or _spec(inputs)
        self.target_spec = target_spec or _spec(targets)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]

    def __repr__(self) -> str:
        return f"<{self.name}: {len(self)} samples, input {self.input_spec}, target {self.target_spec}>"


def _spec(t: torch.Tensor) -> dict[str, Any]:
    spec: dict[str, Any] = {"shape": list(t.shape[1:]), "dtype": str(t.dtype).removeprefix("torch.")}
    if not t.is_floating_point() and t.numel():
        spec["high"] = int(t.max()) + 1
    return spec


def _draw(spec: dict[str, Any], n: int, gen: torch.Generator) -> torch.Tensor:
    shape = (n, *(int(d) for d in spec.get("shape", [])))
    dtype = getattr(torch, str(spec.get("dtype", "float32")), None)
    if not isinstance(dtype, torch.dtype):
        raise DistlabError(
            f"spec dtype: {spec.get('dtype')!r} is not a torch dtype; use 'float32' or 'int64'"
        )
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, int(spec.get("high", 2)), shape, generator=gen, dtype=dtype)


def _teacher_classes(x: torch.Tensor, classes: int, gen: torch.Generator) -> torch.Tensor:
    """Labels from a fixed random linear teacher: argmax(x W), so a student can learn them."""
    flat = x.reshape(len(x), -1).float()
    w = torch.randn(flat.shape[1], classes, generator=gen) / math.sqrt(max(flat.shape[1], 1))
    return (flat @ w).argmax(1)


def from_spec(
    input_spec: dict[str, Any], target_spec: dict[str, Any] | None, n: int, seed: int = 0
) -> TensorPairs:
    """``n`` random samples of ``input_spec``; class targets come from a random linear teacher on float
    inputs."""
    if "inputs" in input_spec or "shape" not in input_spec:
        raise DistlabError(
            f"from_spec: input_spec {input_spec!r} is not one tensor's {{'shape', 'dtype'}}; "
            "for several inputs pass data= a Dataset yourself"
        )
    gen = torch.Generator().manual_seed(seed)
    x = _draw(input_spec, n, gen)
    target_spec = target_spec or {"shape": [], "dtype": "int64", "high": 2}
    integer_target = not str(target_spec.get("dtype", "int64")).startswith(("float", "bfloat"))
    if x.is_floating_point() and integer_target and not target_spec.get("shape"):
        y = _teacher_classes(x, int(target_spec.get("high", 2)), gen)
    else:
        y = _draw(target_spec, n, gen)
    return TensorPairs(x, y, "from_spec", dict(input_spec), dict(target_spec))


def _markov_tokens(
    spec_in: dict[str, Any], n: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token streams from a fixed random Markov chain where each token has 4 likely successors."""
    vocab, seq = int(spec_in["high"]), int(spec_in["shape"][0])
    succ = torch.randint(0, vocab, (vocab, 4), generator=gen)
    tokens = torch.empty(n, seq + 1, dtype=torch.int64)
    tokens[:, 0] = torch.randint(0, vocab, (n,), generator=gen)
    for t in range(seq):
        pick = torch.randint(0, 4, (n,), generator=gen)
        noise = torch.rand(n, generator=gen) < 0.05  # a little noise keeps every token reachable
        nxt = succ[tokens[:, t], pick]
        tokens[:, t + 1] = torch.where(noise, torch.randint(0, vocab, (n,), generator=gen), nxt)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _click_logs(
    spec_in: dict[str, Any], classes: int, n: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Categorical ids with a heavy head (a few rows are hot, as in click logs); labels from per-row
    scores."""
    fields, rows = int(spec_in["shape"][0]), int(spec_in["high"])
    idx = (torch.rand(n, fields, generator=gen) ** 4 * rows).long().clamp_(max=rows - 1)
    score = torch.zeros(n, classes)
    for f in range(fields):
        score += torch.randn(rows, classes, generator=gen)[idx[:, f]]
    return idx, score.argmax(1)


def synthetic(source: Any, n: int = 1024, seed: int = 0) -> TensorPairs:
    """A learnable synthetic data set for a zoo model (name, model or profile), or random data from its specs.

    - ``mlp``/``convnet``: Gaussian inputs, labels from a fixed random linear teacher;
    - ``transformer_lm``: a random Markov chain's token streams, targets the next tokens;
    - ``wide_deep``: skewed categorical ids (hot rows), labels from fixed per-row scores;
    - anything else with ``input_spec``/``target_spec``: :func:`from_spec`.
    """
    if n < 1:
        raise DistlabError(f"synthetic: n must be >= 1, got {n}")
    if isinstance(source, str):
        from distlab import zoo

        source = zoo.get(source)
    name = getattr(source, "zoo_name", None) or getattr(source, "name", None)
    spec_in, spec_out = getattr(source, "input_spec", None), getattr(source, "target_spec", None)
    if not isinstance(spec_in, dict) or "shape" not in spec_in:
        kind = type(source).__name__
        raise DistlabError(
            f"synthetic: {kind} has no input_spec; pass a zoo model, a ModelProfile, or use "
            "distlab.data.from_spec(input_spec, target_spec, n)"
        )
    gen = torch.Generator().manual_seed(seed)
    if name == "transformer_lm":
        x, y = _markov_tokens(spec_in, n, gen)
    elif name == "wide_deep":
        x, y = _click_logs(spec_in, int(spec_out["high"]), n, gen)
    elif name in ("mlp", "convnet"):
        x = _draw(spec_in, n, gen)
        y = _teacher_classes(
            x if name == "mlp" else torch.nn.functional.avg_pool2d(x, 4), int(spec_out["high"]), gen
        )
    else:
        return from_spec(spec_in, spec_out, n, seed)
    return TensorPairs(x, y, f"synthetic:{name}", dict(spec_in), dict(spec_out))


def digits() -> TensorPairs:
    """scikit-learn's handwritten digits: 1797 samples, float32 (64,) scaled to [0, 1], 10 classes.

    ``zoo.get("mlp", in_features=64, classes=10)`` (or :func:`digits_mlp`) fits it.
    """
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    return TensorPairs(
        x, y, "digits", {"shape": [64], "dtype": "float32"}, {"shape": [], "dtype": "int64", "high": 10}
    )


def digits_mlp(width: int = 128, depth: int = 2, seed: int = 0) -> torch.nn.Module:
    """A zoo MLP sized for :func:`digits` (64 inputs, 10 classes)."""
    from distlab import zoo

    return zoo.get("mlp", in_features=64, width=width, depth=depth, classes=10, seed=seed)


# -- a user's data, in the forms a user has it ------------------------------------------------------
DATA_FORMS = (
    "a Dataset of (input, target) pairs, a DataLoader, or an (inputs, targets) pair of tensors or arrays"
)


def _array_like(x: Any) -> bool:
    return isinstance(x, torch.Tensor) or (hasattr(x, "__array__") and hasattr(x, "shape"))


def _tensor(x: Any, what: str) -> torch.Tensor:
    """A tensor of a tensor, NumPy array or pandas frame; float64 becomes float32 (what models hold)."""
    if not isinstance(x, torch.Tensor):
        import numpy as np

        arr = np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x)
        if arr.dtype == object:
            raise DistlabError(
                f"{what}: holds Python objects ({type(x).__name__}); give numbers of one dtype"
            )
        x = torch.from_numpy(np.ascontiguousarray(arr))
    if x.dtype == torch.float64:
        x = x.float()
    elif x.dtype in (torch.int8, torch.int16, torch.int32, torch.uint8):
        x = x.long()
    return x


def as_dataset(data: Any, what: str = "data") -> Any:
    """``data`` as a map-style Dataset: a Dataset as it is, a DataLoader's dataset, an
    ``(inputs, targets)`` pair of tensors, NumPy arrays or pandas frames as a ``TensorPairs``
    (float64 as float32, small integers as int64). None stays None. Anything else: one
    DistlabError naming ``what`` and the forms accepted."""
    if data is None:
        return None
    from torch.utils.data import DataLoader

    if isinstance(data, DataLoader):
        return data.dataset
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(_array_like(t) for t in data):
        x, y = _tensor(data[0], f"{what}[0] (inputs)"), _tensor(data[1], f"{what}[1] (targets)")
        if x.dim() == 0 or len(x) != len(y):
            raise DistlabError(
                f"{what}: {len(x) if x.dim() else 0} inputs but {len(y) if y.dim() else 0} targets; "
                "give one target per input (the first dimension counts samples)"
            )
        kinds = "/".join(dict.fromkeys(type(t).__name__ for t in data))
        return TensorPairs(x, y, f"({kinds} inputs, targets)")
    if _array_like(data):
        raise DistlabError(
            f"{what}: one {type(data).__name__} holds inputs only; "
            "give the targets too: data=(inputs, targets)"
        )
    if hasattr(data, "__len__") and hasattr(data, "__getitem__") and not isinstance(data, (str, bytes, dict)):
        return data
    raise DistlabError(f"{what}: expected {DATA_FORMS}, got {type(data).__name__}")


def describe(data: Any) -> str:
    """One line about a dataset for cards and logs: its name or type, size and sample shapes."""
    name = getattr(data, "name", None) or type(data).__name__
    try:
        n = len(data)
        x, y = data[0]
    except Exception:  # noqa: BLE001 - a description never fails
        return str(name)

    def shape(t: Any) -> str:
        if isinstance(t, (tuple, list)):
            return "(" + ", ".join(shape(u) for u in t) + ")"
        if isinstance(t, torch.Tensor):
            dtype = str(t.dtype).removeprefix("torch.")
            return f"{list(t.shape)} {dtype}" if t.dim() else f"scalar {dtype}"
        return type(t).__name__

    return f"{name}: {n:,} samples, input {shape(x)}, target {shape(y)}"
