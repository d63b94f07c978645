"""Data sets: digits, synthetic generators per zoo model, generic ones from a spec."""

import pytest
import torch

import distlab as dl
from distlab import data, zoo
from distlab.errors import DistlabError


def test_digits():
    ds = data.digits()
    x, y = ds[:]
    assert len(ds) == 1797 and x.shape == (1797, 64) and x.dtype == torch.float32
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() == 1.0
    assert y.dtype == torch.int64 and set(y.tolist()) == set(range(10))
    model = data.digits_mlp()
    assert model(x[:5]).shape == (5, 10) and model.input_spec == ds.input_spec


@pytest.mark.parametrize("name", zoo.names())
def test_synthetic_matches_the_model_specs(name):
    model = zoo.get(name)
    ds = data.synthetic(name, 16)
    x, y = ds[:]
    spec, tspec = model.input_spec, model.target_spec
    assert list(x.shape[1:]) == spec["shape"] and str(x.dtype) == f"torch.{spec['dtype']}"
    assert list(y.shape[1:]) == tspec["shape"] and y.dtype == torch.int64
    assert 0 <= y.min() and y.max() < tspec["high"]
    if spec["dtype"] == "int64":
        assert 0 <= x.min() and x.max() < spec["high"]
    assert len(ds) == 16 and len(ds[3]) == 2


def test_synthetic_is_deterministic_by_seed():
    a, b, c = (data.synthetic("mlp", 32, seed=s)[:][1] for s in (0, 0, 1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len(set(a.tolist())) > 3  # the teacher uses several classes


def test_language_model_targets_are_the_next_tokens():
    x, y = data.synthetic(zoo.get("transformer_lm", seq_len=32, vocab_size=100), 8)[:]
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_wide_deep_ids_are_skewed_to_hot_rows():
    x, _ = data.synthetic("wide_deep", 2000)[:]
    assert (x < 200_000 // 10).float().mean() > 0.5  # a tenth of the rows gets most lookups


def test_from_spec_and_profiles():
    ds = data.from_spec(
        {"shape": [3, 4], "dtype": "float32"}, {"shape": [], "dtype": "int64", "high": 5}, 10, seed=3
    )
    x, y = ds[:]
    assert x.shape == (10, 3, 4) and y.shape == (10,) and y.max() < 5
    prof = dl.ModelProfile.from_variables([("w", (4, 4), "float32", False)])
    with pytest.raises(DistlabError, match="synthetic: ModelProfile has no input_spec"):
        data.synthetic(prof, 4)
    with pytest.raises(DistlabError, match="spec dtype"):
        data.from_spec({"shape": [2], "dtype": "floaty"}, None, 2)
    with pytest.raises(DistlabError, match="is not one tensor's"):
        data.from_spec({"inputs": [{"shape": [2], "dtype": "float32"}]}, None, 2)
