"""distlab.holdout builds its models deterministically and they run a step (nothing is fitted here)."""

from __future__ import annotations

import pytest
import torch

from distlab import holdout
from distlab.errors import DistlabError


@pytest.mark.parametrize("name", holdout.NAMES)
def test_each_model_builds_deterministically_and_trains_a_step(name):
    a, b = holdout.build(name, n=8), holdout.build(name, n=8)
    x, y = a.data.tensors
    assert torch.equal(x, b.data.tensors[0]) and torch.equal(y, b.data.tensors[1])
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    out = a.model(x)
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in a.model.parameters())


def test_an_unknown_model_or_bad_size_is_one_clear_error():
    with pytest.raises(DistlabError, match="available: patch_attention"):
        holdout.build("resnet50")
    with pytest.raises(DistlabError, match="n must be an integer"):
        holdout.build("mixer", n=0)
