"""The models held out once, scored five times and diagnosed on: a diagnostic set now.

They were held out until three benchmarks had scored them five times and a diagnosis had been
drawn from their rows (``datasets/measurements/prediction-paths.md``, 26b), so their figures are
no longer held-out figures: use them, as ``distlab.heldout``'s, to diagnose and develop. The
held-out set is ``distlab.holdout_fresh``, which only its final scoring may import
(``tests/test_holdout_guard.py``).

They are architectures the zoo and the reference models lack, in torch's own layers: a
patch-attention classifier (``nn.MultiheadAttention`` over image patches, a class token), a
DLRM-style mixture of embedding tables (``nn.EmbeddingBag``, bottom and top MLPs, pairwise dot
interactions), an MLP-Mixer (token- and channel-mixing MLPs over patches) and a MobileNet-style
network of depthwise-separable convolutions with BatchNorm. What scored them while they were held
out (files in ``datasets/measurements/``; ``tests/test_holdout_scorings.py`` keeps this list whole):

- ``prediction-paths-2026-11-26.json``: patch attention, DLRM mixture;
- ``prediction-paths-2026-11-26b.json``: all four;
- ``two-hosts-2026-11-27c.json``: patch attention, DLRM mixture;
- ``trace-whatif-2026-11-27-heldout.json``: patch attention, Mixer, depthwise-separable;
- ``trace-whatif-2026-11-27-heldout-bandwidth.json``: patch attention, Mixer;

patch attention five times, the DLRM mixture and the Mixer three, the depthwise-separable network
twice. Each :class:`HeldOut` has ``(input, target)`` pairs with int64 class targets, trained
with the default cross-entropy; models and data are deterministic in ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from distlab.heldout import HeldOut, build_from

NAMES: tuple[str, ...] = ("patch_attention", "dlrm_mix", "mixer", "sepconv")


class PatchAttention(nn.Module):
    """Images -> classes: 8x8 patches projected, a class token, ``depth`` pre-norm blocks of
    ``nn.MultiheadAttention`` and a GELU MLP, the class token classified."""

    def __init__(self, size: int = 32, patch: int = 8, dim: int = 192, depth: int = 3, classes: int = 10):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, (size // patch) ** 2 + 1, dim))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * depth))
        self.attn = nn.ModuleList(nn.MultiheadAttention(dim, 4, batch_first=True) for _ in range(depth))
        self.mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)) for _ in range(depth)
        )
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(len(h), -1, -1), h], dim=1) + self.pos
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlps)):
            a = self.norms[2 * i](h)
            h = h + attn(a, a, a, need_weights=False)[0]
            h = h + mlp(self.norms[2 * i + 1](h))
        return self.head(h[:, 0])


class Mixer(nn.Module):
    """Images -> classes (MLP-Mixer, Tolstikhin et al. 2021): 4x4 patches projected, ``depth``
    blocks of a token-mixing MLP (across the 64 patches) and a channel-mixing MLP, both pre-norm
    and residual, mean over patches, a linear classifier."""

    def __init__(self, size: int = 32, patch: int = 4, dim: int = 128, depth: int = 4, classes: int = 10):
        super().__init__()
        tokens = (size // patch) ** 2
        self.proj = nn.Conv2d(3, dim, patch, stride=patch)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * depth))
        self.token_mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
            for _ in range(depth)
        )
        self.channel_mlps = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)) for _ in range(depth)
        )
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x).flatten(2).transpose(1, 2)
        for i, (tok, chan) in enumerate(zip(self.token_mlps, self.channel_mlps)):
            h = h + tok(self.norms[2 * i](h).transpose(1, 2)).transpose(1, 2)
            h = h + chan(self.norms[2 * i + 1](h))
        return self.head(h.mean(dim=1))


class SepConv(nn.Module):
    """Images -> classes (MobileNet, Howard et al. 2017): a 3x3 stem, then depthwise 3x3
    (``groups`` = channels) + pointwise 1x1 blocks, each with ``BatchNorm2d`` and ReLU6, global
    average pooling, a linear classifier."""

    def __init__(self, widths: tuple[int, ...] = (32, 64, 128, 128, 256), classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, widths[0], 3, 2, 1, bias=False), nn.BatchNorm2d(widths[0])]
        layers.append(nn.ReLU6())
        for i, (a, b) in enumerate(zip(widths, widths[1:])):
            layers += [
                nn.Conv2d(a, a, 3, 2 if i % 2 else 1, 1, groups=a, bias=False),
                nn.BatchNorm2d(a),
                nn.ReLU6(),
                nn.Conv2d(a, b, 1, bias=False),
                nn.BatchNorm2d(b),
                nn.ReLU6(),
            ]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


class DLRMMix(nn.Module):
    """CTR rows -> 2 classes (DLRM, Naumov et al. 2019): ``tables`` ``nn.EmbeddingBag`` of
    different sizes (bags of ids per field), a bottom MLP on the dense features, pairwise dot
    products of every embedding and the dense vector, a top MLP."""

    def __init__(
        self,
        dense: int = 13,
        rows: tuple[int, ...] = (4000, 2500, 1200, 800, 300, 100, 60, 20),
        dim: int = 32,
        bag: int = 3,
    ) -> None:
        super().__init__()
        self.dense, self.bag = dense, bag
        self.tables = nn.ModuleList(nn.EmbeddingBag(r, dim, mode="sum") for r in rows)
        self.bottom = nn.Sequential(nn.Linear(dense, 128), nn.ReLU(), nn.Linear(128, dim), nn.ReLU())
        k = len(rows) + 1
        self.top = nn.Sequential(nn.Linear(k * (k - 1) // 2 + dim, 256), nn.ReLU(), nn.Linear(256, 2))
        self.rows = rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.bottom(x[:, : self.dense])
        ids = x[:, self.dense :].long().reshape(len(x), len(self.tables), self.bag)
        vecs = [d] + [t(ids[:, i] % r) for i, (t, r) in enumerate(zip(self.tables, self.rows))]
        z = torch.stack(vecs, dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))
        i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1)
        return self.top(torch.cat([d, dots[:, i, j]], dim=1))


def _patch(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return (
        PatchAttention(),
        x,
        y,
        "torch nn.MultiheadAttention over 8x8 patches of 3x32x32, 3 blocks, dim 192",
    )


def _dlrm(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    model = DLRMMix()
    ids = torch.randint(0, 4000, (n, len(model.rows) * model.bag), generator=g).float()
    x = torch.cat([torch.rand(n, model.dense, generator=g), ids], dim=1)
    y = torch.randint(0, 2, (n,), generator=g)
    return model, x, y, "DLRM: 8 nn.EmbeddingBag tables (20-4,000 rows, dim 32, bags of 3), dot interactions"


def _mixer(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return Mixer(), x, y, "MLP-Mixer: 4x4 patches of 3x32x32, 4 blocks of token and channel MLPs, dim 128"


def _sepconv(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return SepConv(), x, y, "MobileNet-style depthwise-separable convs + BatchNorm2d over 3x32x32"


_BUILDERS: dict[str, Callable[[torch.Generator, int], tuple[nn.Module, torch.Tensor, torch.Tensor, str]]] = {
    "patch_attention": _patch,
    "dlrm_mix": _dlrm,
    "mixer": _mixer,
    "sepconv": _sepconv,
}


def build(name: str, *, seed: int = 0, n: int = 512) -> HeldOut:
    """Held-out model ``name`` (initialised from ``seed``) with ``n`` synthetic samples."""
    return build_from(_BUILDERS, "holdout.build", name, seed, n)
