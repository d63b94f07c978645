"""Reference models: an MLP, a small ResNet-style convnet, a GPT-style language model and a wide-and-deep
recommender.

Every model carries ``zoo_name``, ``options`` (the size options it was built with),
``input_spec`` and ``target_spec`` (one sample each: ``{"shape", "dtype", "high"}``), so it
can be profiled without a sample and fed synthetic data (``distlab.data.synthetic``).
Outputs are logits and targets class indices, so the default loss is
``cross_entropy(output.reshape(-1, C), target.reshape(-1))``. Models are built
deterministically from ``seed`` without touching the global RNG, and pickle by reference
(cloudpickle ships them to workers that have distlab installed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from distlab.errors import DistlabError


class _ZooModel(nn.Module):
    zoo_name = "model"

    def _describe(
        self, options: dict[str, Any], input_spec: dict[str, Any], target_spec: dict[str, Any]
    ) -> None:
        self.options = dict(options)
        self.input_spec = input_spec
        self.target_spec = target_spec

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.options.items())


class MLP(_ZooModel):
    """``depth`` hidden Linear+ReLU layers of ``width``; ~5.3M parameters at the defaults."""

    zoo_name = "mlp"

    def __init__(self, in_features: int = 512, width: int = 2048, depth: int = 2, classes: int = 10) -> None:
        super().__init__()
        dims = [in_features] + [width] * depth
        layers: list[nn.Module] = []
        for a, b in zip(dims, dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(dims[-1], classes))
        self.net = nn.Sequential(*layers)
        self._describe(
            {"in_features": in_features, "width": width, "depth": depth, "classes": classes},
            {"shape": [in_features], "dtype": "float32"},
            {"shape": [], "dtype": "int64", "high": classes},
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicBlock(nn.Module):
    """ResNet basic block (He et al. 2016): two 3x3 convs with batch norm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ConvNet(_ZooModel):
    """Small ResNet: a 3x3 stem, one basic block per stage (widths ``width * 2**i``), pool, Linear."""

    zoo_name = "convnet"

    def __init__(
        self,
        width: int = 32,
        stages: int = 3,
        blocks: int = 1,
        classes: int = 10,
        in_channels: int = 3,
        image_size: int = 32,
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        body, cin = [], width
        for i in range(stages):
            cout = width * 2**i
            for j in range(blocks):
                body.append(BasicBlock(cin, cout, 2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.body = nn.Sequential(*body)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(cin, classes)
        self._describe(
            {
                "width": width,
                "stages": stages,
                "blocks": blocks,
                "classes": classes,
                "in_channels": in_channels,
                "image_size": image_size,
            },
            {"shape": [in_channels, image_size, image_size], "dtype": "float32"},
            {"shape": [], "dtype": "int64", "high": classes},
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.flatten(self.pool(self.body(self.stem(x)))))


class CausalAttention(nn.Module):
    """Multi-head causal attention core (no parameters) via ``F.scaled_dot_product_attention``."""

    def __init__(self, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = heads
        self.dropout = dropout

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        b, t, three_d = qkv.shape
        d = three_d // 3
        q, k, v = qkv.view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return y.transpose(1, 2).reshape(b, t, d)


class TransformerBlock(nn.Module):
    """Pre-norm GPT block (Radford et al. 2019): attention then a 4x MLP, both residual."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.attn = CausalAttention(heads, dropout)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.proj(self.attn(self.qkv(self.ln1(x))))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TransformerLM(_ZooModel):
    """Decoder-only language model; ~25.2M parameters at the defaults (untied input/output embeddings)."""

    zoo_name = "transformer_lm"

    def __init__(
        self,
        vocab_size: int = 6144,
        d_model: int = 512,
        layers: int = 6,
        heads: int = 8,
        seq_len: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if d_model % heads:
            raise DistlabError(f"transformer_lm: d_model {d_model} is not divisible by heads {heads}")
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self._describe(
            {
                "vocab_size": vocab_size,
                "d_model": d_model,
                "layers": layers,
                "heads": heads,
                "seq_len": seq_len,
                "dropout": dropout,
            },
            {"shape": [seq_len], "dtype": "int64", "high": vocab_size},
            {"shape": [seq_len], "dtype": "int64", "high": vocab_size},
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class WideDeep(_ZooModel):
    """Wide & deep recommender (Cheng et al. 2016): one large embedding table per field + an MLP.

    ``fields`` tables of ``rows`` x ``dim`` (sparse gradients by default) feed a deep MLP; a
    ``rows`` x ``classes`` "wide" table per field adds a linear term. At the defaults the
    tables hold ~27M parameters and the MLP ~0.07M: the gradient of a step touches a few
    rows of each table, which is why parameter servers beat all-reduce here.
    """

    zoo_name = "wide_deep"

    def __init__(
        self,
        fields: int = 4,
        rows: int = 200_000,
        dim: int = 32,
        hidden: tuple[int, ...] = (256, 128),
        classes: int = 2,
        sparse: bool = True,
    ) -> None:
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(rows, dim, sparse=sparse) for _ in range(fields))
        self.wide = nn.ModuleList(nn.Embedding(rows, classes, sparse=sparse) for _ in range(fields))
        dims = [fields * dim, *hidden]
        deep: list[nn.Module] = []
        for a, b in zip(dims, dims[1:]):
            deep += [nn.Linear(a, b), nn.ReLU()]
        deep.append(nn.Linear(dims[-1], classes))
        self.deep = nn.Sequential(*deep)
        self._describe(
            {
                "fields": fields,
                "rows": rows,
                "dim": dim,
                "hidden": tuple(hidden),
                "classes": classes,
                "sparse": sparse,
            },
            {"shape": [fields], "dtype": "int64", "high": rows},
            {"shape": [], "dtype": "int64", "high": classes},
        )

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        cols = idx.unbind(1)
        deep = self.deep(torch.cat([t(c) for t, c in zip(self.tables, cols)], dim=1))
        wide = torch.stack([w(c) for w, c in zip(self.wide, cols)], dim=0).sum(0)
        return deep + wide


_MODELS: dict[str, Callable[..., _ZooModel]] = {
    "mlp": MLP,
    "convnet": ConvNet,
    "transformer_lm": TransformerLM,
    "wide_deep": WideDeep,
}


# Keras 3 reference models: built under the torch backend when this process has not imported Keras
# yet (so they run on distlab's runtime), under whatever backend it has otherwise.
_KERAS_SPECS: dict[int, tuple[Any, dict[str, Any], dict[str, Any]]] = {}  # id -> (weakref, input, target)


def _keras_mlp(in_features: int = 32, width: int = 256, depth: int = 2, classes: int = 10) -> Any:
    import keras

    layers = [keras.Input((in_features,))]
    layers += [keras.layers.Dense(width, activation="relu", name=f"hidden{i}") for i in range(depth)]
    model = keras.Sequential([*layers, keras.layers.Dense(classes, name="out")], name="keras_mlp")
    spec = ({"shape": [in_features], "dtype": "float32"}, {"shape": [], "dtype": "int64", "high": classes})
    return model, spec


def _keras_embedding(rows: int = 10_000, dim: int = 16, fields: int = 8, classes: int = 2) -> Any:
    import keras

    ids = keras.Input((fields,), dtype="int32")
    h = keras.layers.Embedding(rows, dim, name="table")(ids)
    h = keras.layers.Dense(64, activation="relu", name="hidden")(keras.layers.Flatten()(h))
    model = keras.Model(ids, keras.layers.Dense(classes, name="out")(h), name="keras_embedding")
    spec = (
        {"shape": [fields], "dtype": "int32", "high": rows},
        {"shape": [], "dtype": "int64", "high": classes},
    )
    return model, spec


_KERAS: dict[str, Callable[..., Any]] = {"keras_mlp": _keras_mlp, "keras_embedding": _keras_embedding}


def keras_specs(model: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(input_spec, target_spec) of a Keras zoo model, None for any other model."""
    hit = _KERAS_SPECS.get(id(model))
    return (hit[1], hit[2]) if hit is not None and hit[0]() is model else None


def _get_keras(name: str, seed: int, **size_options: Any) -> Any:
    import inspect
    import os
    import sys
    import weakref

    if "keras" not in sys.modules:
        os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except ImportError:
        raise DistlabError(f"zoo.get({name!r}): Keras is not installed; pip install 'distlab[tf]'") from None
    build = _KERAS[name]
    try:
        inspect.signature(build).bind(**size_options)
    except TypeError as exc:
        known = ", ".join(inspect.signature(build).parameters)
        raise DistlabError(f"zoo.get({name!r}): {exc}; size options are: {known}") from None
    keras.utils.set_random_seed(seed)
    model, (spec_in, spec_out) = build(**size_options)
    _KERAS_SPECS[id(model)] = (weakref.ref(model), spec_in, spec_out)
    return model


def names() -> list[str]:
    """Names of the reference torch models (``keras_names()``: the Keras 3 ones)."""
    return list(_MODELS)


def keras_names() -> list[str]:
    """Names of the reference Keras 3 models."""
    return list(_KERAS)


def get(name: str, seed: int = 0, **size_options: Any) -> nn.Module:
    """Build reference model ``name`` with ``size_options``, initialised from ``seed`` (the
    ``keras_*`` models are Keras 3 models: see ``_KERAS``)."""
    if name in _KERAS:
        return _get_keras(name, seed, **size_options)
    try:
        cls = _MODELS[name]
    except KeyError:
        raise DistlabError(
            f"zoo: no model {name!r}; available: {', '.join(names() + keras_names())}"
        ) from None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = cls(**size_options)
        except TypeError as exc:
            import inspect

            known = ", ".join(p for p in inspect.signature(cls.__init__).parameters if p != "self")
            raise DistlabError(f"zoo.get({name!r}): {exc}; size options are: {known}") from None
    model.options["seed"] = seed
    return model
