"""A model library's transformer in a user's own loop (issue 56): transformers' GPT-2 built from a
tiny config (no weights), fed dict batches by a collate function and trained on
``model(**batch).loss`` through ``lab.run`` under AllReduce (DDP) and PS."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
transformers = pytest.importorskip("transformers")

VOCAB, LENGTH, PERIOD = 128, 24, 4


def patterns(n: int, seed: int) -> list[torch.Tensor]:
    """Token sequences that repeat a random 4-token pattern: past the first period each next token
    is a copy, so a causal LM's loss falls far below ln(VOCAB) once it learns to copy."""
    g = torch.Generator().manual_seed(seed)
    return list(torch.randint(1, VOCAB, (n, PERIOD), generator=g).repeat(1, LENGTH // PERIOD))


def collate(rows: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    ids = torch.stack(rows)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=LENGTH, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def copy_accuracy(model: torch.nn.Module, rows: list[torch.Tensor]) -> float:
    """How often the model's most likely next token is right where it is a copy (after the first period)."""
    ids = torch.stack(rows)
    model.eval()
    with torch.no_grad():
        guess = model(input_ids=ids).logits.argmax(-1)[:, PERIOD - 1 : -1]
    return float((guess == ids[:, PERIOD:]).float().mean())


def loop(model: torch.nn.Module, data: list[torch.Tensor], epochs: int):
    def train(ctx):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True, collate_fn=collate)
        m, opt, loader = ctx.prepare(model, opt, loader)
        for _ in ctx.epochs(epochs):
            for batch in loader:
                loss = m(**batch).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
                ctx.report(loss=loss.item())
        return ctx.step

    return train


@pytest.mark.parametrize("strategy", ["AllReduce", "PS"])
def test_a_gpt2_from_its_config_learns_to_copy_on_dict_batches(lab, strategy):
    from distlab.costmodel import CostModel

    lab.cost_model = CostModel.default()  # so the card predicts: the profile of model(**batch)
    run = lab.run(loop(gpt2(), patterns(512, seed=0), epochs=3), strategy=strategy)
    assert run.forecast, f"no prediction for the dict-batch model: {run.forecast!r}"
    assert run.forecast.prediction.basis == "profile"
    run.wait()
    assert run.result == 48  # 3 epochs of 512 samples at 16 per rank on 2 ranks
    losses = run.losses
    assert losses.iloc[:3].mean() > 4.0  # about ln(128) untrained
    assert losses.iloc[-3:].mean() < 0.6 * losses.iloc[:3].mean(), losses.to_string()
    trained = run.model
    assert trained.lm_head.weight is trained.transformer.wte.weight  # GPT-2's tied embedding stays tied
    assert copy_accuracy(trained, patterns(64, seed=1)) > 0.5  # held-out patterns, copied
