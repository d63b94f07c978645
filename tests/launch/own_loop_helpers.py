"""The model, data and loop the own-loop tests share (test_own_loop.py, test_own_loop_faults.py)."""

from __future__ import annotations

import sys

import cloudpickle
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

# Test modules are not importable on the workers: ship their functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class EmbNet(torch.nn.Module):
    """An embedding and two layers: PS and Parallax place its variables differently (the embedding
    sparse-style on a server, the dense layers all-reduced)."""

    def __init__(self, vocab: int = 40) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 8)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.emb(x).mean(1))))


def tokens(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randint(0, 40, (n, 5), generator=g), torch.randint(0, 4, (n,), generator=g))


def loop(prepare=None, body=None, steps: int = 3, loader=None):
    """A loop over ``EmbNet`` whose ``prepare(ctx, model, opt, loader)`` and ``body(ctx, m, opt, x, y)``
    a test replaces to put one mistake in it."""
    torch.manual_seed(0)
    model, data = EmbNet(), tokens(64)

    def plain_body(ctx, m, opt, x, y):
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.report(loss=loss)

    def train(ctx):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ld = loader if loader is not None else DataLoader(data, batch_size=8, shuffle=True)
        m, opt, ld = (prepare or (lambda c, *a: c.prepare(*a)))(ctx, model, opt, ld)
        while ctx.step < steps:
            for x, y in ld:
                (body or plain_body)(ctx, m, opt, x, y)
                if ctx.step >= steps:
                    break
        return ctx.step

    return train
