"""distlab.holdout_fresh builds its models deterministically; each takes a step (nothing timed or fitted)."""

from __future__ import annotations

import pytest
import torch

from distlab import holdout_fresh
from distlab.errors import DistlabError


@pytest.mark.parametrize("name", holdout_fresh.NAMES)
def test_each_model_builds_deterministically_and_trains_a_step(name):
    a, b = holdout_fresh.build(name, n=8), holdout_fresh.build(name, n=8)
    x, y = a.data.tensors
    assert torch.equal(x, b.data.tensors[0]) and torch.equal(y, b.data.tensors[1])
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    out = a.model(x)
    assert out.shape[:-1] == y.shape and y.dtype == torch.int64 and int(y.max()) < out.shape[-1]
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    # every variable gets a gradient (a mixture's unchosen expert a zero one): ranks agree on the set
    assert torch.isfinite(loss) and all(p.grad is not None for p in a.model.parameters())


def test_an_expert_no_token_chose_still_gets_a_gradient():
    model = holdout_fresh.build("moe_mlp", n=1).model
    x = holdout_fresh.build("moe_mlp", n=1).data.tensors[0][:, :1]  # one token: 2 of 8 experts chosen
    model(x).sum().backward()
    zero = [e for e in model.experts[0] if all(float(p.grad.abs().sum()) == 0 for p in e.parameters())]
    assert len(zero) == 6  # the six experts the token did not choose: zero gradients, not None


def test_the_tcn_is_causal():
    model = holdout_fresh.build("tcn", n=2).model
    x = holdout_fresh.build("tcn", n=2).data.tensors[0]
    later = x.clone()
    later[:, :, 64:] += 1.0
    assert torch.allclose(model(x)[:, :64], model(later)[:, :64])
    assert not torch.allclose(model(x)[:, 64:], model(later)[:, 64:])


def test_an_unknown_model_or_bad_size_is_one_clear_error():
    with pytest.raises(DistlabError, match="available: tcn"):
        holdout_fresh.build("patch_attention")
    with pytest.raises(DistlabError, match="n must be an integer"):
        holdout_fresh.build("vit", n=0)
