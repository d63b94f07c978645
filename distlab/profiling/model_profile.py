"""ModelProfile: the model as distribution sees it (variables, layers, gradient-ready order)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from distlab.errors import ProfileError

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

PROFILE_VERSION = 1
DEFAULT_BATCH = 32  # the per-replica batch of a profile, a launch or a magic when none is given


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype named as in torch/numpy (``float32``, ``torch.float16``)."""
    name = str(dtype).removeprefix("torch.")
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise ProfileError(f"dtype {dtype!r} is not known; use one of: {known}") from None


@dataclass(frozen=True)
class VariableProfile:
    """One trainable variable.

    ``sparse``: its gradient is a sparse tensor (``nn.Embedding(sparse=True)``).
    ``embedding``: it is an embedding table, whose gradient touches few rows even when dense.
    ``touched_rows``: rows a step's gradient touches (embeddings only; ``None``: unknown).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    nbytes: int = 0
    sparse: bool = False
    embedding: bool = False
    layer: str = ""
    touched_rows: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def row_bytes(self) -> int:
        """Bytes of one slice along axis 0 (one embedding row)."""
        if not self.shape:
            return self.nbytes
        return self.nbytes // max(self.shape[0], 1)


@dataclass(frozen=True)
class LayerProfile:
    """One leaf module. FLOPs count 2 per multiply-add; times are seconds at the profiled batch."""

    name: str
    kind: str
    params: int = 0
    flops_fwd: float = 0.0
    flops_bwd: float = 0.0
    time_fwd: float = 0.0
    time_bwd: float = 0.0
    activation_bytes: int = 0


@dataclass(frozen=True)
class ModelProfile:
    """Everything the planner needs to know about a model, and nothing that needs torch.

    ``grad_ready_order`` lists variable names in the order their gradients become ready
    during backward (roughly the reverse of creation order). ``input_spec`` and
    ``target_spec`` describe one sample so synthetic data can be generated:
    ``{"shape": [...], "dtype": "float32"|"int64", "high": int}``.
    """

    variables: tuple[VariableProfile, ...]
    layers: tuple[LayerProfile, ...] = ()
    batch_size: int = DEFAULT_BATCH
    grad_ready_order: tuple[str, ...] = ()
    name: str = "model"
    input_spec: dict[str, Any] | None = None
    target_spec: dict[str, Any] | None = None
    step_time: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [v.name for v in self.variables]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ProfileError(f"variables: names repeated: {dup}; every variable needs a unique name")
        if self.batch_size <= 0:
            raise ProfileError(f"batch_size: must be positive, got {self.batch_size}")
        if not self.grad_ready_order:
            object.__setattr__(self, "grad_ready_order", tuple(reversed(names)))
        elif sorted(self.grad_ready_order) != sorted(names):
            raise ProfileError("grad_ready_order: must list every variable exactly once")

    # -- construction -------------------------------------------------------------------
    @classmethod
    def from_variables(
        cls,
        variables: Iterable[Sequence[Any]],
        *,
        batch_size: int = DEFAULT_BATCH,
        name: str = "synthetic",
        flops_per_sample: float = 0.0,
        time_per_sample: float = 0.0,
    ) -> ModelProfile:
        """Build a profile without a model: ``[(name, shape, dtype, sparse), ...]``.

        A variable is marked ``embedding`` when it is sparse or its name says so ("emb").
        Optional ``flops_per_sample``/``time_per_sample`` (forward + backward) give the
        planner a compute figure; they are spread over the variables by size.
        """
        vars_: list[VariableProfile] = []
        for i, item in enumerate(variables):
            if not isinstance(item, (tuple, list)) or not 2 <= len(item) <= 4:
                raise ProfileError(f"variables[{i}]: expected (name, shape, dtype, sparse), got {item!r}")
            vname, shape = str(item[0]), item[1]
            dtype = str(item[2]) if len(item) > 2 else "float32"
            sparse = bool(item[3]) if len(item) > 3 else False
            try:
                shape_t = tuple(int(d) for d in shape)
            except (TypeError, ValueError):
                raise ProfileError(f"variables[{i}].shape: expected a tuple of ints, got {shape!r}") from None
            if any(d < 0 for d in shape_t):
                raise ProfileError(f"variables[{i}].shape: dimensions must be >= 0, got {shape_t}")
            nbytes = math.prod(shape_t) * dtype_bytes(dtype)
            embedding = sparse or "emb" in vname.lower()
            vars_.append(
                VariableProfile(
                    vname,
                    shape_t,
                    dtype.removeprefix("torch."),
                    nbytes,
                    sparse,
                    embedding,
                    vname.rsplit(".", 1)[0],
                )
            )
        if not vars_:
            raise ProfileError("variables: a profile needs at least one variable")
        total = sum(v.numel for v in vars_) or 1
        layers = []
        for v in vars_:
            share = v.numel / total
            layers.append(
                LayerProfile(
                    name=v.name,
                    kind="Variable",
                    params=v.numel,
                    flops_fwd=flops_per_sample * batch_size * share / 3,
                    flops_bwd=flops_per_sample * batch_size * share * 2 / 3,
                    time_fwd=time_per_sample * batch_size * share / 3,
                    time_bwd=time_per_sample * batch_size * share * 2 / 3,
                )
            )
        step = time_per_sample * batch_size if time_per_sample else None
        return cls(tuple(vars_), tuple(layers), batch_size=batch_size, name=name, step_time=step)

    # -- totals ----------------------------------------------------------------------------
    @property
    def num_params(self) -> int:
        return sum(v.numel for v in self.variables)

    @property
    def param_bytes(self) -> int:
        return sum(v.nbytes for v in self.variables)

    @property
    def flops(self) -> float:
        """Forward + backward FLOPs of one step at ``batch_size``."""
        return sum(layer.flops_fwd + layer.flops_bwd for layer in self.layers)

    @property
    def flops_per_sample(self) -> float:
        return self.flops / self.batch_size

    @property
    def compute_time(self) -> float:
        """Forward + backward seconds at ``batch_size``: the measured step if known, else the layer sum."""
        if self.step_time is not None:
            return self.step_time
        return sum(layer.time_fwd + layer.time_bwd for layer in self.layers)

    @property
    def thread_efficiency(self) -> float | None:
        """How this model's step scales with threads (``meta["thread_efficiency"]``, measured by
        ``dl.profile`` on one thread and on the process's threads), or None when not measured."""
        e = self.meta.get("thread_efficiency")
        return (
            float(e) if isinstance(e, (int, float)) and not isinstance(e, bool) and math.isfinite(e) else None
        )

    def compute_time_at(self, batch: float) -> float:
        """Forward + backward seconds at a per-replica ``batch``; ``compute_time`` at ``batch_size``.

        With ``meta["step_fit"]`` (``dl.profile`` measures steps at two batches and fits
        ``alpha + beta * batch``), the fitted line scaled to pass through ``compute_time`` at
        ``batch_size``; without it, ``compute_time`` scaled linearly with the batch.
        """
        try:
            b = float(batch)
        except (TypeError, ValueError):
            b = math.nan
        if not (math.isfinite(b) and b > 0):
            raise ProfileError(f"compute_time_at: batch must be a positive number, got {batch!r}")
        total = self.compute_time
        fit = self.meta.get("step_fit")
        if isinstance(fit, dict):
            try:
                alpha, beta = float(fit["alpha"]), float(fit["beta"])
            except (KeyError, TypeError, ValueError):
                alpha = beta = -1.0
            at_profiled = alpha + beta * self.batch_size
            if alpha >= 0 and beta >= 0 and at_profiled > 0:
                return total * ((alpha + beta * b) / at_profiled)
        return total * (b / self.batch_size)

    def variable(self, name: str) -> VariableProfile:
        for v in self.variables:
            if v.name == name:
                return v
        raise ProfileError(f"variable {name!r} is not in profile {self.name!r}")

    # -- views and serialisation -----------------------------------------------------------
    def to_frame(self):  # -> pandas.DataFrame
        """One row per layer."""
        import pandas as pd

        cols = [f.name for f in fields(LayerProfile)]
        return pd.DataFrame([asdict(layer) for layer in self.layers], columns=cols)

    def variables_frame(self):  # -> pandas.DataFrame
        """One row per variable."""
        import pandas as pd

        cols = [f.name for f in fields(VariableProfile)]
        return pd.DataFrame([asdict(v) for v in self.variables], columns=cols)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["version"] = PROFILE_VERSION
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelProfile:
        try:
            variables = tuple(VariableProfile(**{**v, "shape": tuple(v["shape"])}) for v in d["variables"])
            layers = tuple(LayerProfile(**layer) for layer in d.get("layers", ()))
            return cls(
                variables=variables,
                layers=layers,
                batch_size=int(d.get("batch_size", 32)),
                grad_ready_order=tuple(d.get("grad_ready_order", ())),
                name=d.get("name", "model"),
                input_spec=d.get("input_spec"),
                target_spec=d.get("target_spec"),
                step_time=d.get("step_time"),
                meta=dict(d.get("meta") or {}),
            )
        except (KeyError, TypeError) as exc:
            raise ProfileError(
                f"profile JSON: malformed ({exc}); write it with ModelProfile.to_json()"
            ) from None

    @classmethod
    def from_json(cls, text: str) -> ModelProfile:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"profile JSON: not valid JSON ({exc})") from None
        if not isinstance(d, dict):
            raise ProfileError("profile JSON: expected an object at the top level")
        return cls.from_dict(d)

    # -- rendering ------------------------------------------------------------------------------
    def summary(self) -> str:
        n_sparse = sum(v.sparse for v in self.variables)
        n_emb = sum(v.embedding for v in self.variables)
        return (
            f"{self.name}: {len(self.variables)} variables ({n_sparse} sparse, {n_emb} embedding), "
            f"{self.num_params:,} parameters, {format_bytes(self.param_bytes)}, "
            f"{self.flops_per_sample / 1e6:.1f} MFLOP/sample, step {self.compute_time * 1e3:.1f} ms "
            f"at batch {self.batch_size}"
        )

    def __repr__(self) -> str:
        return f"<ModelProfile {self.summary()}>"

    def _repr_html_(self) -> str:
        import html

        head = f"<p><b>{html.escape(self.summary())}</b></p>"
        if not self.layers:
            return head
        df = self.to_frame()
        times = [c for c in df.columns if c.startswith("time")]
        df[times] = df[times] * 1e3  # ms, as the chart shows them
        df = df.rename(columns={c: f"{c} (ms)" for c in times})
        return head + df.to_html(index=False, float_format=lambda x: f"{x:.4g}")


def format_bytes(n: float) -> str:
    """``40960`` -> ``40.0 KiB``: bytes in the largest binary unit that keeps the figure >= 1."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
