"""The fresh held-out models: what the final scoring measures distlab's predictions on, once.

No benchmark, calibration stage, default, cost-model term or test has seen these architectures:
``tests/test_holdout_guard.py`` fails if any file but this module, the test of its shapes (builds
each model and takes one step on one batch: nothing is timed, fitted or predicted) and the final
scoring (``notebooks/bench/prediction-paths.ipynb`` with ``model_set="fresh"``) names this module
in code, and ``tests/test_holdout_scorings.py`` fails once two result files have scored them. The set scored
before these (``distlab.holdout``) was scored five times and diagnosed on; it is a diagnostic
set now.

The four models, each in torch's own layers or a model library's config without weights:

- ``tcn``: a temporal convolution network (Bai et al. 2018): causal dilated ``Conv1d`` residual
  blocks (dilations 1, 2, 4, 8), labelling every time step of a multichannel signal;
- ``graph_sage``: a graph network (GraphSAGE, Hamilton et al. 2017) on one fixed synthetic graph
  of 256 nodes: mean aggregation over in-edges by ``index_add_``, node classification of a signal
  on the nodes (the graph travels with the model as buffers);
- ``moe_mlp``: a mixture-of-experts MLP (Shazeer et al. 2017): a softmax gate routes each token
  to its top 2 of 8 expert MLPs, each expert runs only its tokens;
- ``vit``: transformers' ``ViTForImageClassification`` from a ``ViTConfig`` (4 layers, hidden
  128, 4x4 patches of 3x32x32), no weights.

Each :class:`distlab.heldout.HeldOut` has ``(input, target)`` pairs with int64 class targets
(per sample, per time step or per node), trained with the default cross-entropy
``cross_entropy(out.reshape(-1, classes), target.reshape(-1))``; models and data are
deterministic in ``seed``. ``vit`` needs ``transformers`` (the ``bench`` extra).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from distlab.heldout import ATTN_IMPLEMENTATION, HeldOut, HFLogits, build_from, library_version, require

NAMES: tuple[str, ...] = ("tcn", "graph_sage", "moe_mlp", "vit")


class CausalBlock(nn.Module):
    """Two causal dilated convolutions (left padding only: step t sees steps <= t), ReLU, a residual."""

    def __init__(self, channels: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.pad = (kernel - 1) * dilation
        self.conv1 = nn.Conv1d(channels, channels, kernel, dilation=dilation)
        self.conv2 = nn.Conv1d(channels, channels, kernel, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv1(F.pad(x, (self.pad, 0))))
        h = self.conv2(F.pad(h, (self.pad, 0)))
        return F.relu(x + h)


class TCN(nn.Module):
    """Signals ``[B, inputs, T]`` -> per-step logits ``[B, T, classes]``: a 1x1 projection, causal
    dilated residual blocks, a 1x1 classifier."""

    def __init__(
        self,
        inputs: int = 8,
        channels: int = 96,
        kernel: int = 3,
        dilations: tuple[int, ...] = (1, 2, 4, 8),
        classes: int = 4,
    ) -> None:
        super().__init__()
        self.proj = nn.Conv1d(inputs, channels, 1)
        self.blocks = nn.Sequential(*(CausalBlock(channels, kernel, d) for d in dilations))
        self.head = nn.Conv1d(channels, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.proj(x))).transpose(1, 2)


def random_graph(nodes: int, degree: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(src, dst) of a directed graph: a ring (connected) plus ``degree - 1`` random in-edges a node."""
    g = torch.Generator().manual_seed(seed)
    ring = torch.arange(nodes)
    src = [torch.roll(ring, 1)] + [torch.randint(0, nodes, (nodes,), generator=g) for _ in range(degree - 1)]
    return torch.cat(src), ring.repeat(degree)


class SAGELayer(nn.Module):
    """``h_v' = relu(W_self h_v + W_neigh mean_{u -> v} h_u)`` over the graph's edges."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.self_lin = nn.Linear(dim_in, dim_out)
        self.neigh_lin = nn.Linear(dim_in, dim_out, bias=False)

    def forward(
        self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, inv_deg: torch.Tensor
    ) -> torch.Tensor:
        agg = torch.zeros_like(h).index_add_(1, dst, h[:, src]) * inv_deg[None, :, None]
        return F.relu(self.self_lin(h) + self.neigh_lin(agg))


class GraphSAGE(nn.Module):
    """Node signals ``[B, nodes, features]`` on one fixed graph -> node logits ``[B, nodes, classes]``."""

    def __init__(
        self,
        nodes: int = 256,
        degree: int = 6,
        features: int = 16,
        hidden: int = 128,
        layers: int = 3,
        classes: int = 4,
        graph_seed: int = 7,
    ) -> None:
        super().__init__()
        src, dst = random_graph(nodes, degree, graph_seed)
        self.register_buffer("src", src)
        self.register_buffer("dst", dst)
        deg = torch.zeros(nodes).index_add_(0, dst, torch.ones(len(dst)))
        self.register_buffer("inv_deg", 1.0 / deg.clamp(min=1.0))
        dims = [features] + [hidden] * layers
        self.layers = nn.ModuleList(SAGELayer(a, b) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer in self.layers:
            h = layer(h, self.src, self.dst, self.inv_deg)
        return self.head(h)


class MoEMLP(nn.Module):
    """Token rows ``[B, tokens, dim]`` -> per-sample logits: ``blocks`` residual MoE layers (a
    softmax gate, each token to its top ``k`` experts, their outputs weighted by the renormalised
    gate), mean over tokens, a linear classifier."""

    def __init__(
        self,
        dim: int = 64,
        hidden: int = 256,
        experts: int = 8,
        k: int = 2,
        blocks: int = 2,
        classes: int = 10,
    ) -> None:
        super().__init__()
        self.k = k
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(blocks))
        self.gates = nn.ModuleList(nn.Linear(dim, experts, bias=False) for _ in range(blocks))
        self.experts = nn.ModuleList(
            nn.ModuleList(
                nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
                for _ in range(experts)
            )
            for _ in range(blocks)
        )
        self.head = nn.Linear(dim, classes)

    def _moe(self, x: torch.Tensor, gate: nn.Module, experts: nn.Module) -> torch.Tensor:
        weights, chosen = torch.topk(gate(x).softmax(-1), self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(experts.children()):
            # every expert runs, on its tokens or on none: an expert no token chose gets a zero
            # gradient rather than none, so every rank's variables stay the same set
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            out = out.index_add(0, rows, expert(x[rows]) * weights[rows, slot, None])
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = x.reshape(b * t, d)
        for norm, gate, experts in zip(self.norms, self.gates, self.experts):
            h = h + self._moe(norm(h), gate, experts)
        return self.head(h.reshape(b, t, d).mean(1))


Built = tuple[nn.Module, torch.Tensor, torch.Tensor, str]


def _tcn(g: torch.Generator, n: int) -> Built:
    model = TCN()
    x = torch.randn(n, 8, 128, generator=g)
    # the label of a step: the sign pattern of a causal moving sum of two channels (learnable, causal)
    s = torch.cumsum(x[:, :2], dim=2)
    y = (s[:, 0] > 0).long() * 2 + (s[:, 1] > 0).long()
    return model, x, y, "TCN: 4 causal dilated Conv1d residual blocks (d=1,2,4,8, 96 ch) over 8x128 signals"


def _graph(g: torch.Generator, n: int) -> Built:
    model = GraphSAGE()
    x = torch.randn(n, 256, 16, generator=g)
    y = torch.randint(0, 4, (n, 256), generator=g)
    return model, x, y, "GraphSAGE: 3 mean-aggregation layers by index_add_ on a 256-node, 1,536-edge graph"


def _moe(g: torch.Generator, n: int) -> Built:
    model = MoEMLP()
    x = torch.randn(n, 16, 64, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return model, x, y, "MoE MLP: 2 layers of 8 experts (64-256-64), top-2 softmax gate, 16 tokens of 64"


def _vit(g: torch.Generator, n: int) -> Built:
    tf = require("vit", "transformers", "transformers")
    opts = dict(
        image_size=32,
        patch_size=4,
        num_channels=3,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=256,
        num_labels=10,
    )
    net = tf.ViTForImageClassification(tf.ViTConfig(**opts, attn_implementation=ATTN_IMPLEMENTATION))
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    kw = ", ".join(f"{k}={v!r}" for k, v in opts.items())
    return (
        HFLogits(net, "pixel_values"),
        x,
        y,
        f"transformers {library_version(tf)} ViTForImageClassification(ViTConfig({kw}))",
    )


_BUILDERS: dict[str, Callable[[torch.Generator, int], Built]] = {
    "tcn": _tcn,
    "graph_sage": _graph,
    "moe_mlp": _moe,
    "vit": _vit,
}


def build(name: str, *, seed: int = 0, n: int = 512) -> HeldOut:
    """Fresh held-out model ``name`` (initialised from ``seed``) with ``n`` synthetic samples."""
    return build_from(_BUILDERS, "holdout_fresh.build", name, seed, n)
