"""Models from public definitions outside distlab, once held out, now the models distlab was diagnosed on.

They are **no longer held out**: calibration format 16 added its 34 MB reference MLP after
their Gossip errors and the gain was reported on them, and formats 18-19's profile-path fix was
diagnosed on all six (the GRU LM, GPT-2, BERT and the BatchNorm ResNet in benchmark runs, all six
in an offline evaluation of the compute fit; docs/cost-model.md, Calibration formats). The
LSTM tagger and the 1-D BatchNorm convnet came from ``distlab.holdout`` on 2026-11-26: on a
GPU they exposed the measured step taken on a GPU Lab's CPU (``datasets/measurements/gpu``);
their CPU figures of that day in ``prediction-paths-2026-11-26.json`` were measured while they
were still held out. Their
figures in the ``cost-model-accuracy`` and ``profile-accuracy`` benchmarks are figures on models
distlab was tuned on. So are :mod:`distlab.holdout`'s (scored five times and diagnosed on);
the held-out set is ``distlab.holdout_fresh``, which only its final scoring imports.
The architectures come from torch itself (``torch.nn.GRU``, a plain MLP), HuggingFace
``transformers`` (ResNet with batch norm, BERT, GPT-2) and ``deepctr-torch`` (DeepFM), built
from small configs without weights.
``transformers`` and ``deepctr-torch`` are the ``bench`` extra (``pip install 'distlab[bench]'``)
and are imported only by :func:`build`, so importing this module stays light.

Each :class:`HeldOut` wraps its library model as an ``nn.Module`` whose forward takes ONE
tensor batch (int64 token ids, float pixels or float CTR rows) and returns logits
``[batch, classes]`` or ``[batch, seq, vocab]``. Its ``data`` holds ``(input, target)`` pairs
with int64 class targets, so the loss is the default
``cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))`` (``loss`` is None).
Models are built under ``torch.manual_seed(seed)`` inside a forked RNG (the global RNG is left
as it was); the data come from their own generator, so both are deterministic in ``seed``.
The wrappers are module-level classes: models pickle by reference to distlab and the library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from distlab.errors import DistlabError, check_positive

# a model set's builder: (generator, samples) -> (model, inputs, targets, where it comes from)
Builder = Callable[[torch.Generator, int], tuple[nn.Module, torch.Tensor, torch.Tensor, str]]

NAMES: tuple[str, ...] = (
    "gru_lm",
    "resnet_bn",
    "bert_cls",
    "gpt2_lm",
    "deepfm",
    "mlp",
    "lstm_tagger",
    "conv1d_bn",
)

#: attention kernel asked of transformers: torch's scaled_dot_product_attention, which works on
#: CPU torch and whose FLOPs distlab's profiler counts (``"eager"`` works too, just slower).
ATTN_IMPLEMENTATION = "sdpa"

_FIX = "pip install 'distlab[bench]'"


@dataclass(frozen=True)
class HeldOut:
    """One held-out model with its synthetic data; ``loss`` None means the default cross-entropy."""

    name: str
    model: nn.Module
    data: TensorDataset
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
    source: str


def require(name: str, module: str, dist: str) -> Any:
    """Import ``module`` for model ``name``, or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DistlabError(
            f"heldout.build({name!r}) needs {dist}, which cannot be imported ({exc}); {_FIX}"
        ) from None


def library_version(module: Any) -> str:
    return str(getattr(module, "__version__", "?"))


def _kw(opts: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in opts.items())


# --------------------------------------------------------------------------- wrappers


class GRULM(nn.Module):
    """Recurrent language model: ``nn.Embedding`` -> ``nn.GRU`` (torch's own) -> ``nn.Linear``."""

    def __init__(self, vocab: int, embed: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.gru = nn.GRU(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(self.embed(ids))
        return self.head(out)


class HFLogits(nn.Module):
    """``ids -> logits`` (or ``pixel_values -> logits``) around a transformers model."""

    def __init__(self, net: nn.Module, input_name: str = "input_ids") -> None:
        super().__init__()
        self.net = net
        self.input_name = input_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(**{self.input_name: x}).logits


class CTRLogits(nn.Module):
    """Two-class logits ``[0, z]`` around a deepctr-torch model that returns one raw logit ``z``.

    The model is built with ``task="regression"`` so it skips its sigmoid; softmax over ``[0, z]``
    is ``[1 - sigmoid(z), sigmoid(z)]``, so the default cross-entropy is exactly deepctr's binary
    log-loss. The input is deepctr's own single float tensor: sparse ids then dense values.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.net(x).reshape(-1, 1)
        return torch.cat([torch.zeros_like(z), z], dim=1)


class MLP(nn.Module):
    """Plain MLP from torch.nn: Linear+GELU+LayerNorm hidden layers, then a Linear classifier."""

    def __init__(self, features: int, hidden: tuple[int, ...], classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip((features, *hidden), hidden):
            layers += [nn.Linear(a, b), nn.GELU(), nn.LayerNorm(b)]
        layers.append(nn.Linear(hidden[-1], classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


# --------------------------------------------------------------------------- builders
# Each returns (model, input, target, source) for n samples drawn from generator g.

SEQ = 32
VOCAB = 2048


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


def _tokens(
    g: torch.Generator, n: int, vocab: int = VOCAB, seq: int = SEQ
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token pairs: ``seq + 1`` random tokens, input the first ``seq``, target the last ``seq``."""
    s = torch.randint(0, vocab, (n, seq + 1), generator=g)
    return s[:, :-1].contiguous(), s[:, 1:].contiguous()


def _gru_lm(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    opts = {"vocab": VOCAB, "embed": 128, "hidden": 256, "layers": 2}
    x, y = _tokens(g, n)
    src = f"torch {torch.__version__} nn.Embedding -> nn.GRU -> nn.Linear ({opts}, seq={SEQ})"
    return GRULM(**opts), x, y, src


def _resnet_bn(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    tf = require("resnet_bn", "transformers", "transformers")
    opts = {
        "num_channels": 3,
        "embedding_size": 32,
        "hidden_sizes": [32, 64, 128, 256],
        "depths": [1, 1, 1, 1],
        "layer_type": "basic",
        "num_labels": 10,
    }
    net = tf.ResNetForImageClassification(tf.ResNetConfig(**opts))
    size = 64
    x = torch.randn(n, 3, size, size, generator=g)
    y = torch.randint(0, opts["num_labels"], (n,), generator=g)
    src = (
        f"transformers {library_version(tf)} ResNetForImageClassification(ResNetConfig({_kw(opts)})), "
        f"pixels 3x{size}x{size}"
    )
    return HFLogits(net, "pixel_values"), x, y, src


def _bert_cls(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    tf = require("bert_cls", "transformers", "transformers")
    opts = {
        "vocab_size": VOCAB,
        "hidden_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "max_position_embeddings": 64,
        "num_labels": 4,
    }
    net = tf.BertForSequenceClassification(tf.BertConfig(**opts, attn_implementation=ATTN_IMPLEMENTATION))
    x, _ = _tokens(g, n)
    y = torch.randint(0, opts["num_labels"], (n,), generator=g)
    src = (
        f"transformers {library_version(tf)} BertForSequenceClassification(BertConfig({_kw(opts)}, "
        f"attn_implementation={ATTN_IMPLEMENTATION!r})), seq={SEQ}"
    )
    return HFLogits(net), x, y, src


def _gpt2_lm(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    tf = require("gpt2_lm", "transformers", "transformers")
    opts = {
        "vocab_size": VOCAB,
        "n_positions": 64,
        "n_embd": 256,
        "n_layer": 2,
        "n_head": 4,
        "bos_token_id": VOCAB - 1,
        "eos_token_id": VOCAB - 1,
        "use_cache": False,
    }
    net = tf.GPT2LMHeadModel(tf.GPT2Config(**opts, attn_implementation=ATTN_IMPLEMENTATION))
    x, y = _tokens(g, n)
    src = (
        f"transformers {library_version(tf)} GPT2LMHeadModel(GPT2Config({_kw(opts)}, "
        f"attn_implementation={ATTN_IMPLEMENTATION!r})), seq={SEQ}, lm_head tied to wte"
    )
    return HFLogits(net), x, y, src


def _deepfm(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    """DeepFM (Guo et al. 2017) on a Criteo-shaped input: 26 categorical and 13 dense fields."""
    dc = require("deepfm", "deepctr_torch", "deepctr-torch")
    inputs = require("deepfm", "deepctr_torch.inputs", "deepctr-torch")
    models = require("deepfm", "deepctr_torch.models", "deepctr-torch")
    sparse, dense, rows, dim, hidden = 26, 13, 15_000, 16, (400, 400, 400)
    cols = [inputs.SparseFeat(f"C{i}", rows, embedding_dim=dim) for i in range(sparse)]
    cols += [inputs.DenseFeat(f"I{i}", 1) for i in range(dense)]
    # deepctr re-seeds torch with its `seed` argument: hand it build()'s seed (set just before)
    seed = torch.initial_seed()
    net = models.DeepFM(cols, cols, dnn_hidden_units=hidden, task="regression", seed=seed)
    ids = torch.randint(0, rows, (n, sparse), generator=g).to(torch.float32)
    x = torch.cat([ids, torch.rand(n, dense, generator=g)], dim=1)
    y = torch.randint(0, 2, (n,), generator=g)
    src = (
        f"deepctr-torch {library_version(dc)} DeepFM({sparse} SparseFeat({rows}, "
        f"embedding_dim={dim}) + {dense} DenseFeat, "
        f"dnn_hidden_units={hidden}, task='regression'), logits [0, z]"
    )
    return CTRLogits(net), x, y, src


def _mlp(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    opts = {"features": 784, "hidden": (2048, 2048, 1024), "classes": 10}
    x = torch.randn(n, opts["features"], generator=g)
    y = torch.randint(0, opts["classes"], (n,), generator=g)
    return MLP(**opts), x, y, f"torch {torch.__version__} MLP of nn.Linear+GELU+LayerNorm ({opts})"


def _lstm(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    x = torch.randint(0, 1000, (n, 24), generator=g)
    y = x % 17  # learnable: the tag is a function of the token
    return (
        LSTMTagger(),
        x,
        y,
        "torch nn.Embedding -> nn.LSTM(2 layers, bidirectional) -> nn.Linear, 24 tokens",
    )


def _conv(g: torch.Generator, n: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    x = torch.randn(n, 40, 128, generator=g)
    y = torch.randint(0, 12, (n,), generator=g)
    return Conv1dBN(), x, y, "torch Conv1d + BatchNorm1d x4 over 40x128 frames"


_BUILDERS: dict[str, Callable[[torch.Generator, int], tuple[nn.Module, torch.Tensor, torch.Tensor, str]]] = {
    "gru_lm": _gru_lm,
    "resnet_bn": _resnet_bn,
    "bert_cls": _bert_cls,
    "gpt2_lm": _gpt2_lm,
    "deepfm": _deepfm,
    "mlp": _mlp,
    "lstm_tagger": _lstm,
    "conv1d_bn": _conv,
}


def build_from(builders: dict[str, Builder], where: str, name: str, seed: int, n: int) -> HeldOut:
    """Model ``name`` of ``builders`` (a model set's table), initialised from ``seed``, with ``n``
    synthetic samples; ``where`` names the set's ``build`` in errors. Every set builds this way."""
    if name not in builders:
        raise DistlabError(f"{where}: no model {name!r}; available: {', '.join(builders)}")
    check_positive(f"{where}({name!r}): n", n)
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, x, y, source = builders[name](g, n)
    model.train()
    return HeldOut(name=name, model=model, data=TensorDataset(x, y), loss=None, source=source)


def build(name: str, *, seed: int = 0, n: int = 512) -> HeldOut:
    """Build held-out model ``name`` (initialised from ``seed``) with ``n`` synthetic samples."""
    return build_from(_BUILDERS, "heldout.build", name, seed, n)
