"""``%%distlab run`` in a real IPython shell (issue 56): a notebook's own loop, the cell's code, trains
transformers' GPT-2 built from a tiny config on dict batches under AllReduce and PS; the variables
the cell reads travel by value, and one that cannot is named in one line."""

from __future__ import annotations

import pytest

from tests.notebook.conftest import magic_shell
from tests.notebook.conftest import run as line_magic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
pytest.importorskip("transformers")

# the notebook's cells before the magic: a model from its config, patterned tokens, a dict collate
SETUP = """
import threading
import torch, transformers
from torch.utils.data import DataLoader

def patterns(n, seed):
    g = torch.Generator().manual_seed(seed)
    return list(torch.randint(1, 128, (n, 4), generator=g).repeat(1, 6))

def collate(rows):
    ids = torch.stack(rows)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

torch.manual_seed(0)
config = transformers.GPT2Config(vocab_size=128, n_positions=24, n_embd=64, n_layer=2, n_head=2,
                                 bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config)
untrained = {k: v.clone() for k, v in model.state_dict().items()}
data, held_out = patterns(512, 0), torch.stack(patterns(64, 1))
lock = threading.Lock()
"""

# the loop as a user writes it: `model` is the notebook's until ctx.prepare rebinds it (on the ranks)
CELL = """\
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
loader = DataLoader(data, batch_size=16, shuffle=True, collate_fn=collate)
model, opt, loader = ctx.prepare(model, opt, loader)
for epoch in ctx.epochs(3):
    for batch in loader:
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.report(loss=loss.item())
return ctx.step
"""


@pytest.fixture(scope="module")
def session_shell():
    """One notebook (shell and magics) for the module, the setup cell run; its cluster stopped after."""
    with magic_shell() as (sh, magics):
        assert sh.run_cell(SETUP).success
        yield sh, magics


def cell(sh, line: str, body: str, capsys) -> tuple[str, str]:
    """Run a notebook cell ``%%distlab LINE`` over ``body``; (stdout, stderr)."""
    capsys.readouterr()
    assert sh.run_cell(f"%%distlab {line}\n{body}").success
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.mark.parametrize("line", ["run -o ar", "run --strategy PS --workers 2 -o ps"])
def test_the_cell_trains_gpt2_on_dict_batches_and_its_run_comes_back(session_shell, line, capsys):
    sh, _ = session_shell
    name = line.split()[-1]
    out, err = cell(sh, line, CELL, capsys)
    assert "Traceback" not in err and "distlab:" not in err, err
    run = sh.user_ns[name]
    assert f"run {run.id} is in `{name}`" in out
    assert run.strategy.name == ("PS" if "PS" in line else "AllReduce") and run.world == 2
    assert run.forecast.prediction.basis == "profile"  # the card predicts model(**batch)'s profile
    assert run.result == 48  # the cell's return: 3 epochs of 512 samples, 16 per rank on 2 ranks
    losses = run.losses
    assert losses.iloc[-3:].mean() < 0.6 * losses.iloc[:3].mean(), losses.to_string()
    ids = sh.user_ns["held_out"]
    with __import__("torch").no_grad():
        guess = run.model.eval()(input_ids=ids).logits.argmax(-1)[:, 3:-1]
    assert float((guess == ids[:, 4:]).float().mean()) > 0.5  # held-out patterns, copied
    # the cell's rebinding of `model` stayed on the ranks: the notebook's model is untrained
    untrained, model = sh.user_ns["untrained"], sh.user_ns["model"]
    assert all(model.state_dict()[k].equal(v) for k, v in untrained.items())


@pytest.mark.parametrize(
    "head, expected",
    [
        ("with lock:\n    pass\n", ["the cell reads `lock`, a lock that cannot be sent"]),
        ("print(modle)\n", ["the cell reads `modle`, which is not defined", "did you mean 'model'?"]),
        (
            "n = len(data) // 0\n",
            ["ZeroDivisionError", "at line 2 (n = len(data) // 0)", "before ctx.prepare"],
        ),
        ("%time x = 1\n", ["line 2 of the cell: invalid syntax", "no %magics"]),
    ],
)
def test_a_cell_that_cannot_run_says_why_in_one_line_and_nothing_runs(session_shell, head, expected, capsys):
    sh, magics = session_shell
    runs = len(magics.session.runs)
    out, err = cell(sh, "run -o bad", head + CELL, capsys)
    assert err.count("\n") == 1 and all(e in err for e in expected), err
    assert "bad" not in sh.user_ns and len(magics.session.runs) == runs


def test_a_cell_that_raises_on_a_rank_names_the_cells_line(session_shell, capsys):
    sh, _ = session_shell
    failing = CELL.replace(
        "        ctx.report(", "        assert ctx.step < 5, 'diverged'\n        ctx.report("
    )
    out, err = cell(sh, "run -o failed", failing, capsys)
    assert err.count("\n") == 1 and "at step 5" in err and "cell line 11" in err and "diverged" in err, err


def test_help_shows_run_as_a_cell_magic_and_a_line_without_a_cell_says_so(session_shell, capsys):
    sh, _ = session_shell
    out, err = line_magic(sh, "help run", capsys)
    assert "%%distlab run [--strategy NAME|FILE|VAR] [--workers N]" in out and "run.result" in out, out
    out, err = line_magic(sh, "run --strategy PS", capsys)
    assert err == "distlab: run takes a cell: %%distlab run [options] on its first line, your loop below\n"
    out, err = cell(sh, "launch model --strategy PS", "x = 1", capsys)
    assert "only run takes a cell" in err and "run" not in sh.user_ns
