"""dl.profile on real torch models: FLOPs against hand counts, flags, gradient order, timing,
serialisation."""

import pytest
import torch
from torch import nn

import distlab as dl
from distlab import ModelProfile
from distlab.zoo import CausalAttention

FAST = {"repeats": 1, "warmup": 0}


def layer(prof, name):
    return next(layer for layer in prof.layers if layer.name == name)


def mlp3():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 30), nn.ReLU(), nn.Linear(30, 40), nn.ReLU(), nn.Linear(40, 5))


def test_linear_flops_match_hand_count():
    b = 8
    prof = dl.profile(mlp3(), batch_size=b, **FAST)
    first, mid, last = layer(prof, "0"), layer(prof, "2"), layer(prof, "4")
    assert first.flops_fwd == 2 * b * 20 * 30
    # the first layer's input needs no gradient: backward computes only the weight gradient
    assert first.flops_bwd == 2 * b * 20 * 30
    assert mid.flops_fwd == 2 * b * 30 * 40 and mid.flops_bwd == 2 * mid.flops_fwd
    assert last.flops_fwd == 2 * b * 40 * 5 and last.flops_bwd == 4 * b * 40 * 5
    assert layer(prof, "1").flops_fwd == 0 and layer(prof, "1").kind == "ReLU"
    assert prof.flops == sum(x.flops_fwd + x.flops_bwd for x in prof.layers)


def test_flops_are_exact_at_the_requested_batch_not_the_metered_micro_batch():
    prof = dl.profile(mlp3(), batch_size=7, micro_batch=2, **FAST)
    assert prof.meta["meter_batch"] == 2  # micro_batch only sizes the per-op metered passes
    assert prof.meta["time_batch"] == 7 and prof.meta["step_fit"]["batches"][0] == 7
    assert layer(prof, "2").flops_fwd == 2 * 7 * 30 * 40
    assert prof.flops_per_sample == pytest.approx(prof.flops / 7)


def test_conv2d_flops_match_hand_count():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 4))
    b = 2
    prof = dl.profile(model, torch.randn(b, 3, 16, 16), batch_size=b, **FAST)
    conv = layer(prof, "0")
    assert conv.kind == "Conv2d"
    assert conv.flops_fwd == 2 * b * 8 * 16 * 16 * 3 * 3 * 3
    assert conv.activation_bytes == b * 8 * 16 * 16 * 4


class AttnNet(nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.attn = CausalAttention(heads)

    def forward(self, x):
        return self.attn(self.qkv(x))


class InlineAttn(AttnNet):
    """SDPA called in a non-leaf module's own forward: its FLOPs must not vanish."""

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).sum(1)


def test_attention_flops_count_scaled_dot_product_attention():
    b, t, d = 2, 10, 32
    prof = dl.profile(AttnNet(d), torch.randn(b, t, d), batch_size=b, **FAST)
    attn = layer(prof, "attn")
    assert attn.flops_fwd == 4 * b * t * t * d  # QK^T and AV: 2 matmuls of 2*b*h*t*t*(d/h)
    assert attn.flops_bwd == 10 * b * t * t * d  # torch's SDPA backward formula: 5 such matmuls
    inline = dl.profile(InlineAttn(d), torch.randn(b, t, d), batch_size=b, **FAST)
    root = layer(inline, "(root)")
    assert root.kind == "InlineAttn" and root.flops_fwd == 4 * b * t * t * d


class Rec(nn.Module):
    def __init__(self):
        super().__init__()
        self.users = nn.Embedding(1000, 8, sparse=True)
        self.items = nn.Embedding(500, 8)
        self.tags = nn.EmbeddingBag(300, 8, sparse=True)
        self.out = nn.Linear(24, 2)

    def forward(self, x):
        return self.out(torch.cat([self.users(x[:, 0]), self.items(x[:, 1]), self.tags(x[:, 2:])], 1))


def test_variables_flag_sparse_and_embedding_tables():
    prof = dl.profile(Rec(), torch.randint(0, 300, (4, 5)), batch_size=4, **FAST)
    v = {x.name: x for x in prof.variables}
    assert [x.name for x in prof.variables] == [n for n, _ in Rec().named_parameters()]
    assert v["users.weight"].sparse and v["users.weight"].embedding
    assert not v["items.weight"].sparse and v["items.weight"].embedding
    assert v["tags.weight"].sparse and v["tags.weight"].embedding
    assert not v["out.weight"].sparse and not v["out.weight"].embedding
    assert v["users.weight"].shape == (1000, 8) and v["users.weight"].dtype == "float32"
    assert v["users.weight"].nbytes == 1000 * 8 * 4 and v["users.weight"].layer == "users"
    assert v["out.bias"].layer == "out"
    # rows a step touches, at most: 4 samples x 1 lookup (users), x 3 lookups (tags)
    assert v["users.weight"].touched_rows == 4 and v["tags.weight"].touched_rows == 12
    assert v["out.weight"].touched_rows is None
    assert prof.num_params == sum(p.numel() for p in Rec().parameters())


class Backwards(nn.Module):
    """Registers its layers in the opposite order of use."""

    def __init__(self):
        super().__init__()
        self.c = nn.Linear(4, 3)
        self.b = nn.Linear(8, 4)
        self.a = nn.Linear(6, 8)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def test_grad_ready_order_follows_the_real_backward():
    prof = dl.profile(mlp3(), batch_size=4, **FAST)
    order = prof.grad_ready_order
    assert set(order[:2]) == {"4.weight", "4.bias"}  # the last layer's gradients are ready first
    assert set(order[-2:]) == {"0.weight", "0.bias"}
    prof = dl.profile(Backwards(), torch.randn(4, 6), batch_size=4, **FAST)
    layers_in_order = [name.split(".")[0] for name in prof.grad_ready_order]
    assert list(dict.fromkeys(layers_in_order)) == ["c", "b", "a"]
    assert [x.name for x in prof.layers] == ["a", "b", "c"]  # layers listed in forward order


@pytest.mark.parametrize(
    "model, spec",
    [
        (nn.Sequential(nn.Linear(12, 3)), {"shape": [12], "dtype": "float32"}),
        (
            nn.Sequential(nn.Embedding(50, 4), nn.Flatten(), nn.Linear(64, 2)),
            {"shape": [16], "dtype": "int64", "high": 50},
        ),
        (
            nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 30 * 30, 2)),
            {"shape": [3, 32, 32], "dtype": "float32"},
        ),
    ],
)
def test_sample_input_inferred_from_the_first_layer(model, spec):
    prof = dl.profile(model, batch_size=2, **FAST)
    assert prof.input_spec == spec
    assert prof.meta["input_inferred"] is True


def test_given_sample_sets_the_per_sample_spec():
    prof = dl.profile(nn.Linear(5, 2), torch.randn(3, 5), batch_size=6, **FAST)
    assert prof.input_spec == {"shape": [5], "dtype": "float32"}
    assert prof.batch_size == 6 and layer(prof, "(root)").flops_fwd == 2 * 6 * 5 * 2


def test_timing_is_measured_and_adds_up_to_the_step():
    prof = dl.profile(mlp3(), batch_size=16, repeats=3, warmup=1)
    frame = prof.to_frame()
    assert list(frame.columns) == [
        "name",
        "kind",
        "params",
        "flops_fwd",
        "flops_bwd",
        "time_fwd",
        "time_bwd",
        "activation_bytes",
    ]
    assert list(frame["name"]) == ["0", "1", "2", "3", "4"]
    assert prof.step_time > 0
    assert (frame.loc[frame.kind == "Linear", ["time_fwd", "time_bwd"]] > 0).all().all()
    assert frame.time_fwd.sum() + frame.time_bwd.sum() == pytest.approx(prof.step_time, rel=1e-6)
    assert layer(prof, "2").activation_bytes == 16 * 40 * 4


def test_json_round_trip_of_a_real_profile():
    prof = dl.profile(Rec(), torch.randint(0, 300, (4, 5)), batch_size=4, **FAST)
    back = ModelProfile.from_json(prof.to_json())
    assert back == prof
    assert back.variable("users.weight").sparse


def test_profile_restores_mode_grads_buffers_and_leaves_no_hooks():
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))
    model.eval()
    model[0].weight.grad = torch.ones(6, 4)
    stats = model[1].running_mean.clone()
    rng = torch.get_rng_state()
    dl.profile(model, batch_size=8, **FAST)
    assert not model.training and not model[1].training
    assert torch.equal(model[0].weight.grad, torch.ones(6, 4)) and model[2].weight.grad is None
    assert torch.equal(model[1].running_mean, stats)
    assert torch.equal(torch.get_rng_state(), rng)
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
    for p in model.parameters():
        assert not getattr(p, "_post_accumulate_grad_hooks", None)


class DataDependent(nn.Module):
    """Reads a value back (``.item()``), which fake tensors cannot do."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        h = self.fc(x)
        return h * float(h.detach().abs().sum().item() > 0)


def test_flops_fall_back_to_a_scaled_real_count_when_fake_tensors_fail():
    prof = dl.profile(DataDependent(), torch.randn(2, 6), batch_size=10, micro_batch=5, **FAST)
    assert "scaled to batch_size" in prof.meta["flops_method"]
    assert layer(prof, "fc").flops_fwd == 2 * 10 * 6 * 3
    assert layer(prof, "fc").activation_bytes == 10 * 3 * 4
