"""Held-out benchmark models: each trains a step on its data, is deterministic, pickles, profiles; imports
stay lazy."""

import copy
import pickle
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import distlab as dl
from distlab import heldout
from distlab.errors import DistlabError
from tests.fresh import run_python

pytestmark = pytest.mark.usefixtures("one_thread")

# the library each model needs, beyond torch (all of them in the `bench` extra)
LIBRARY = {
    "resnet_bn": "transformers",
    "bert_cls": "transformers",
    "gpt2_lm": "transformers",
    "deepfm": "deepctr_torch",
}


def build(name, **kw):
    if name in LIBRARY:
        pytest.importorskip(LIBRARY[name])
    return heldout.build(name, **kw)


def loss_of(h, x, y):
    out = h.model(x)
    if h.loss is not None:
        return out, h.loss(out, y)
    return out, F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def first_batch(h, size):
    return next(iter(DataLoader(h.data, batch_size=size)))


def test_names():
    assert set(heldout.NAMES) >= {"gru_lm", "resnet_bn", "bert_cls", "gpt2_lm", "deepfm", "mlp"}
    assert len(set(heldout.NAMES)) == len(heldout.NAMES) >= 6


@pytest.mark.parametrize(
    "name",
    # resnet_bn's step on its data takes seconds: left to `make test`
    [pytest.param(n, marks=pytest.mark.slow) if n == "resnet_bn" else n for n in heldout.NAMES],
)
def test_one_training_step_on_its_data(name):
    h = build(name, n=64)
    assert isinstance(h, heldout.HeldOut) and h.name == name and h.source
    assert isinstance(h.data, TensorDataset) and len(h.data) == 64
    with pytest.raises(AttributeError):
        h.name = "other"  # frozen
    x, y = first_batch(h, 4)
    assert y.dtype == torch.int64 and x.shape[0] == y.shape[0] == 4
    h.model.train()
    out, loss = loss_of(h, x, y)
    assert out.shape[:-1] == y.shape and out.dim() in (2, 3)
    assert 0 <= int(y.min()) and int(y.max()) < out.shape[-1]
    loss.backward()
    assert torch.isfinite(loss)
    params = list(h.model.named_parameters())
    assert params and all(p.requires_grad for _, p in params)
    missing = [n for n, p in params if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"no finite gradient for {missing}"


@pytest.mark.parametrize("name", heldout.NAMES)
def test_trains_on_a_batch_of_two(name):
    h = build(name, n=8)
    x, y = first_batch(h, 2)
    h.model.train()
    assert torch.isfinite(loss_of(h, x, y)[1])


@pytest.mark.parametrize("name", heldout.NAMES)
def test_deterministic_from_seed_without_touching_global_rng(name):
    rng = torch.get_rng_state()
    a, b, c = (build(name, seed=s, n=16) for s in (3, 3, 4))
    assert torch.equal(torch.get_rng_state(), rng)
    losses = []
    for h in (a, b, c):
        torch.manual_seed(0)  # the same dropout masks for all three
        losses.append(loss_of(h, *first_batch(h, 8))[1].item())
    assert losses[0] == losses[1] and losses[0] != losses[2]
    assert all(torch.equal(p, q) for p, q in zip(a.model.parameters(), b.model.parameters()))
    assert all(torch.equal(s, t) for s, t in zip(a.data.tensors, b.data.tensors))
    assert not all(torch.equal(s, t) for s, t in zip(a.data.tensors, c.data.tensors))


@pytest.mark.parametrize("name", heldout.NAMES)
def test_pickles_and_deep_copies(name):
    h = build(name, n=8)
    model = h.model.eval()
    x, _ = first_batch(h, 4)
    ref = model(x)
    for back in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert type(back) is type(model) and torch.equal(back.eval()(x), ref)


def test_gpt2_ties_lm_head_to_the_token_embedding_and_lists_it_once():
    h = build("gpt2_lm", n=8)
    net = h.model.net
    assert net.lm_head.weight is net.transformer.wte.weight
    names = [n for n, _ in h.model.named_parameters()]
    assert len(names) == len({id(p) for p in h.model.parameters()})
    assert "net.transformer.wte.weight" in names and "net.lm_head.weight" not in names
    back = pickle.loads(pickle.dumps(h.model))
    assert back.net.lm_head.weight is back.net.transformer.wte.weight


def test_deepfm_is_embedding_heavy():
    model = build("deepfm", n=8).model
    total = sum(p.numel() for p in model.parameters())
    tables = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    assert tables > 0.8 * total


@pytest.mark.parametrize("name", heldout.NAMES)
def test_profiles(name):
    h = build(name, n=16)
    prof = dl.profile(h.model, sample_input=first_batch(h, 8)[0], batch_size=8, repeats=1, warmup=0)
    assert prof.flops > 0 and prof.step_time > 0
    assert sum(v.nbytes for v in prof.variables) == 4 * sum(p.numel() for p in h.model.parameters())


def test_unknown_name_and_bad_n():
    with pytest.raises(DistlabError, match="no model 'resnet50'; available: gru_lm"):
        heldout.build("resnet50")
    with pytest.raises(DistlabError, match="n must be an integer >= 1"):
        heldout.build("mlp", n=0)


def test_importing_the_module_does_not_import_the_libraries():
    code = (
        "import sys, distlab.heldout as h; "
        "bad = [m for m in ('transformers', 'deepctr_torch') if m in sys.modules]; "
        "assert not bad, bad; h.build('mlp', n=4); "
        "assert 'transformers' not in sys.modules"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(("name", "module"), [("bert_cls", "transformers"), ("deepfm", "deepctr_torch")])
def test_missing_library_says_how_to_install_it(name, module, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # import of `module` now fails as if absent
    with pytest.raises(DistlabError, match=r"pip install 'distlab\[bench\]'") as info:
        heldout.build(name, n=4)
    assert "\n" not in str(info.value) and name in str(info.value)
