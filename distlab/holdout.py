"""The held-out models: what distlab's predictions are scored on, and nothing else reads.

No calibration stage, default, cost-model term or test was fitted, tuned or diagnosed on these
(``tests/test_holdout_guard.py`` fails if any module of distlab or any test but the one that
checks their shapes imports this module; the ``prediction-paths`` benchmark is their one user).
They are architectures the zoo and the reference models lack, in torch's own layers: a
bidirectional LSTM tagger (recurrent), a patch-attention classifier (``nn.MultiheadAttention``
over image patches, a class token), a 1-D convolutional network with BatchNorm over
audio-like frames, and a DLRM-style mixture of embedding tables (``nn.EmbeddingBag``, bottom
and top MLPs, pairwise dot interactions).

A model that is ever used to diagnose or tune distlab leaves this set (to
``distlab.heldout``, whose models were: its docstring says how) and the benchmark's data card
says so. Each :class:`HeldOut` has ``(input, target)`` pairs with int64 class targets, trained
with the default cross-entropy; models and data are deterministic in ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import TensorDataset

from distlab.errors import DistlabError
from distlab.heldout import HeldOut

NAMES: tuple[str, ...] = ("lstm_tagger", "patch_attention", "conv1d_bn", "dlrm_mix")


class LSTMTagger(nn.Module):
    """Token ids -> per-token tags: ``nn.Embedding`` -> 2-layer bidirectional ``nn.LSTM`` -> ``nn.Linear``."""

    def __init__(self, vocab: int = 1000, embed: int = 64, hidden: int = 128, tags: int = 17) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, tags)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


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


class Conv1dBN(nn.Module):
    """Frames -> classes: four ``Conv1d`` + ``BatchNorm1d`` + ReLU blocks (stride 2), global
    average pooling, a linear classifier (a keyword-spotting network's shape)."""

    def __init__(self, channels: int = 40, width: int = 96, classes: int = 12) -> None:
        super().__init__()
        blocks: list[nn.Module] = []
        for a, b in zip((channels, width, width, 2 * width), (width, width, 2 * width, 2 * width)):
            blocks += [nn.Conv1d(a, b, 5, stride=2, padding=2), nn.BatchNorm1d(b), nn.ReLU()]
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=2))


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


def _lstm(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    x = torch.randint(0, 1000, (n, 24), generator=g)
    y = x % 17  # learnable: the tag is a function of the token
    return (
        LSTMTagger(),
        x,
        y,
        "torch nn.Embedding -> nn.LSTM(2 layers, bidirectional) -> nn.Linear, 24 tokens",
    )


def _patch(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return (
        PatchAttention(),
        x,
        y,
        "torch nn.MultiheadAttention over 8x8 patches of 3x32x32, 3 blocks, dim 192",
    )


def _conv(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    x = torch.randn(n, 40, 128, generator=g)
    y = torch.randint(0, 12, (n,), generator=g)
    return Conv1dBN(), x, y, "torch Conv1d + BatchNorm1d x4 over 40x128 frames"


def _dlrm(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    model = DLRMMix()
    ids = torch.randint(0, 4000, (n, len(model.rows) * model.bag), generator=g).float()
    x = torch.cat([torch.rand(n, model.dense, generator=g), ids], dim=1)
    y = torch.randint(0, 2, (n,), generator=g)
    return model, x, y, "DLRM: 8 nn.EmbeddingBag tables (20-4,000 rows, dim 32, bags of 3), dot interactions"


_BUILDERS: dict[str, Callable[[torch.Generator, int], tuple[nn.Module, torch.Tensor, torch.Tensor, str]]] = {
    "lstm_tagger": _lstm,
    "patch_attention": _patch,
    "conv1d_bn": _conv,
    "dlrm_mix": _dlrm,
}


def build(name: str, *, seed: int = 0, n: int = 512) -> HeldOut:
    """Held-out model ``name`` (initialised from ``seed``) with ``n`` synthetic samples."""
    if name not in _BUILDERS:
        raise DistlabError(f"holdout.build: no model {name!r}; available: {', '.join(NAMES)}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DistlabError(f"holdout.build({name!r}): n must be an integer >= 1, got {n!r}")
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, x, y, source = _BUILDERS[name](g, n)
    model.train()
    return HeldOut(name=name, model=model, data=TensorDataset(x, y), loss=None, source=source)
