"""The noisy quadratic (McCandlish et al. 2018): a task whose gradient noise scale is known.

Per-sample loss 1/2 |w - c_i|^2 with c_i ~ N(mu, s2 I) in d dimensions: the gradient is
G = w - mu, per-sample tr(Sigma) = d s2, so phi = d s2 / |w - mu|^2. The noise-scale tests and
``measure_noise_scale``'s checks train or freeze ``Quadratic`` on ``noisy_quadratic`` data.
"""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset


class Quadratic(torch.nn.Module):
    """forward(c) = w - c: with ``quadratic_loss``, the per-sample loss 1/2 |w - c|^2."""

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(w.clone())

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return self.w - c


def quadratic_loss(out: torch.Tensor, _target: torch.Tensor) -> torch.Tensor:
    return 0.5 * (out * out).sum(1).mean()


def noisy_quadratic(
    d: int = 64, s2: float = 1.0, n: int = 8192, seed: int = 0, dist: float = 1.0
) -> tuple[torch.Tensor, TensorDataset]:
    """w with |w - mu|^2 = ``dist`` and ``n`` samples c_i ~ N(mu, s2 I): phi = d s2 / dist."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(d, generator=g)
    u = torch.randn(d, generator=g)
    w = mu + dist**0.5 * u / u.norm()
    c = mu + s2**0.5 * torch.randn(n, d, generator=g)
    return w, TensorDataset(c, torch.zeros(n))
