"""Every bad input to dl.profile is one ProfileError line naming the cause."""

import pytest
import torch
from torch import nn

import distlab as dl
from distlab.errors import DistlabError, ProfileError

FAST = {"repeats": 1, "warmup": 0}


def message(model, *args, **kwargs):
    with pytest.raises(ProfileError) as info:
        dl.profile(model, *args, **{**FAST, **kwargs})
    text = str(info.value)
    assert "\n" not in text and isinstance(info.value, DistlabError)
    return text


def test_not_a_model():
    assert message([1, 2]) == "profile: expected a torch nn.Module or keras.Model, got list"


def test_keras_model_without_keras(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "keras", None)  # as where Keras is not installed: its import fails
    Model = type("Model", (), {"__module__": "keras.src.models.model"})
    text = message(Model())
    assert "Keras" in text and "pip install distlab[tf]" in text


def test_model_without_parameters():
    assert "has no trainable parameters" in message(nn.Sequential(nn.ReLU()))
    frozen = nn.Linear(3, 3).requires_grad_(False)
    assert message(frozen).startswith("profile: Linear has no trainable parameters")


def test_input_shape_cannot_be_inferred():
    text = message(nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))
    assert text == (
        "sample_input: cannot infer the input shape of Sequential (first layer 0 is ReLU); "
        "pass sample_input=a batch it accepts (in a magic: --sample-input VAR or --data VAR)"
    )


def test_an_input_spec_of_the_wrong_form_is_refused_with_the_format():
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    model.input_spec = (1, 8, 8)  # a shape, not the dict: never silently ignored
    text = message(model)
    assert text.startswith("Sequential.input_spec: expected one sample's {'shape'")
    assert "got (1, 8, 8)" in text


def test_wrong_sample_shape_names_layer_and_expected_shape():
    model = nn.Sequential(nn.Linear(10, 4), nn.ReLU(), nn.Linear(4, 2))
    text = message(model, torch.randn(3, 7))
    assert (
        "layer '0' (Linear) expects inputs whose last dimension is 10 (in_features), got shape [batch, 7]"
        in text
    )


def test_mismatch_deep_inside_names_the_inner_layer():
    model = nn.Sequential(nn.Linear(10, 5), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))
    text = message(model, torch.randn(3, 10))
    assert "layer '1.1' (Linear) expects inputs whose last dimension is 4" in text


def test_conv_channels_mismatch():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
    text = message(model, torch.randn(2, 1, 8, 8))
    assert "layer '0' (Conv2d) expects 3 input channels" in text and "[batch, 1, 8, 8]" in text


def test_embedding_gets_floats_or_out_of_range_indices():
    model = nn.Sequential(nn.Embedding(10, 4))
    assert "layer '0' (Embedding) expects int64 indices, got float32" in message(model, torch.randn(2, 3))
    assert "layer '0' (Embedding) has 10 rows, got index 12" in message(model, torch.tensor([[1, 12]]))


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.bad = Exploding()

    def forward(self, x):
        return self.bad(self.fc(x))


class Exploding(nn.Module):
    def forward(self, x):
        raise ValueError("no good")


def test_forward_that_raises_names_the_failing_layer():
    text = message(Broken(), torch.randn(2, 3))
    assert text.startswith("forward: layer 'bad' (Exploding) failed: ValueError: no good")


def test_sample_input_that_is_not_a_tensor():
    assert "sample_input: expected a torch.Tensor" in message(nn.Linear(3, 1), [[1.0, 2.0, 3.0]])


def test_bad_batch_size():
    assert message(nn.Linear(3, 1), batch_size=0) == "profile: batch_size must be an integer >= 1, got 0"


def test_zoo_model_with_wrong_sample_says_what_it_takes():
    from distlab import zoo

    lm = zoo.get("transformer_lm", vocab_size=100, d_model=32, layers=1, heads=4, seq_len=16)
    text = message(lm, torch.randint(0, 100, (2, 40)))
    assert "layer 'pos_emb' (Embedding) has 16 rows, got index 39" in text
    assert "TransformerLM takes per-sample int64 [16]; sample_input gives int64 [40]" in text
    assert "expects int64 indices, got float32" in message(lm, torch.randn(2, 16))
