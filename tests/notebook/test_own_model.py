"""A newcomer's own model and data through the magics, in a real IPython shell on a real cluster:
a BatchNorm CNN on scikit-learn's digits through --data, a tabular model through an (X, y) pair
of NumPy arrays; the trained run.model scored on held-out digits; mistakes that lose nothing."""

from __future__ import annotations

import glob
import os
import tempfile
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

from tests.notebook.conftest import magic_shell


class DigitsCNN(nn.Module):
    """Not a zoo model: 8x8 digits -> 10 classes, BatchNorm down to a 1x1 map."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        return self.head(self.body(x).flatten(1))


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y = (d.data / 16.0).astype(np.float64), d.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def _accuracy(model, x, y) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(torch.as_tensor(x, dtype=torch.float32)).argmax(-1).numpy()
    return float((pred == y).mean())


@pytest.fixture(scope="module")
def session_shell():
    """One shell and one magics instance (one notebook) for the module; its cluster stopped after."""
    with magic_shell() as (sh, magics):
        (xtr, ytr), (xte, yte) = _digits()
        torch.manual_seed(0)
        sh.user_ns.update(
            cnn=DigitsCNN(),
            train=torch.utils.data.TensorDataset(
                torch.tensor(xtr, dtype=torch.float32).reshape(-1, 1, 8, 8), torch.tensor(ytr)
            ),
            test_images=xte.reshape(-1, 1, 8, 8),
            test_x=xte,
            test_y=yte,
            tab=nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)),
            pair=(xtr, ytr),  # NumPy float64 inputs, int64 targets
        )
        yield sh, magics


def magic(sh, line: str, capsys) -> tuple[str, str]:
    capsys.readouterr()
    sh.run_line_magic("distlab", line)
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    # stderr also carries tqdm's progress bars: what the magic says is its "distlab: " lines
    said = "".join(ln + "\n" for ln in out.err.replace("\r", "\n").splitlines() if ln.startswith("distlab: "))
    return out.out, said


def test_a_batchnorm_cnn_on_digits_trains_through_the_magics_and_comes_back(session_shell, capsys):
    sh, magics = session_shell
    out, err = magic(sh, "cluster local 2", capsys)
    assert err == ""
    out, err = magic(sh, "profile cnn --data train --batch-size 32", capsys)
    assert err == "" and "DigitsCNN" in out
    # the data is remembered: launch needs no --data again
    out, err = magic(sh, "launch cnn --strategy allreduce --steps 200 -o cnn_run", capsys)
    assert err == "", err
    assert "is in `cnn_run`" in out and "synthetic" not in out
    run = sh.user_ns["cnn_run"]
    assert run.status == "finished" and run.strategy.builder == "AllReduce"  # 'allreduce' matched
    card = run._repr_html_()
    assert "1,400 samples" in card and "cross-entropy" in card and "first step" in card
    assert "Adam(learning_rate=0.001) (distlab&#x27;s default)" in card  # the optimizer that ran
    assert "cnn_run.model" in card
    # predicted with the model's step measured on the workers, the collectives not calibrated: said
    assert "samples/s (before the run, from the measured step, typically within" in card
    assert "not calibrated: default collectives" in card and "%distlab calibrate" in card
    assert "not calibrated (%distlab calibrate)" in magics.session.current_lab._repr_html_()
    assert list(run.losses.index) == list(range(run.steps))  # the per-step series, as fit's history
    first, last = run.losses.iloc[[0, -1]]
    assert last < first
    acc = _accuracy(run.model, sh.user_ns["test_images"], sh.user_ns["test_y"])
    print(f"digits accuracy through the magics (BatchNorm CNN, 200 steps): {acc:.3f}")
    assert acc >= 0.9  # the defaults (Adam at 1e-3) train a newcomer's model in a few hundred steps


def test_a_tabular_model_trains_on_an_x_y_pair_of_arrays(session_shell, capsys):
    sh, _ = session_shell
    out, err = magic(sh, "launch tab --strategy PS --data pair --steps 500 --optimizer SGD --lr 0.1", capsys)
    assert err == "", err
    run = sh.user_ns["run"]  # the default -o
    assert "(ndarray inputs, targets): 1,400 samples, input [64] float32" in run._repr_html_()
    assert "SGD(learning_rate=0.1)" in run._repr_html_()
    acc = _accuracy(run.model, sh.user_ns["test_x"], sh.user_ns["test_y"])
    assert acc > 0.5


def test_launch_adaptive_trains_with_an_adaptive_batch_over_the_named_builder(session_shell, capsys):
    sh, _ = session_shell
    out, err = magic(
        # SGD: with Adam (the default) the noise scale leaves out variables on parameter servers
        sh,
        "launch tab --strategy PS --data pair --batch-size 8 --steps 400 --adaptive --optimizer sgd -o ad",
        capsys,
    )
    assert err == "", err
    run = sh.user_ns["ad"]
    assert run.status == "finished" and run.strategy.builder == "AdaptiveBatch"
    assert run.strategy.options["base"] == "PS" and run.strategy.batch.lr_scaling == "adascale"
    m = run.metrics
    assert {"noise_scale", "global_batch", "goodput", "lr_gain"} <= set(m.columns)
    assert m["noise_scale"].iloc[-1] > 0


def test_the_ranking_has_the_single_process_row(session_shell, capsys):
    sh, _ = session_shell
    out, err = magic(sh, "simulate tab -o ranking", capsys)
    assert err == ""
    table = sh.user_ns["ranking"]
    assert "1 process (no distribution)" in set(table["strategy"])
    assert (table.loc[table["strategy"] == "1 process (no distribution)", "world"] == 1).all()
    # never calibrated: the step is the model's own, the collectives the default model's, and it says so
    assert "predicted with the default cost model" in table.attrs["note"]
    assert table.attrs["note"].count("not calibrated") == 0  # said once, the specific way
    assert set(table["basis"]) == {"measured step"}  # simulate measured the model's own step
    # stale and asynchronous plans are ranked by throughput: each row and the note above say so
    stale = table[[p.stale for p in table["plan"]]]
    said = "convergence not counted: lab.probe_staleness"
    assert len(stale) and all(n.startswith(said) for n in stale["note"])
    assert "convergence not counted for " in table.attrs["note"]
    out, err = magic(sh, f"simulate tab --top {len(table)}", capsys)
    assert err == "" and said in out  # the table's note column
    lab = session_shell[1].session.current_lab  # simulate measured the step: a cost model, uncalibrated
    assert lab.cost_model is not None and "not calibrated (%distlab calibrate)" in lab._repr_html_()


def test_mistakes_lose_nothing(session_shell, capsys):
    sh, magics = session_shell
    lab = magics.session.current_lab
    runs_before = len(magics.session.runs)
    assert runs_before >= 2
    start = time.monotonic()
    out, err = magic(sh, "cluster local 99", capsys)
    assert time.monotonic() - start < 1.0
    assert "this machine has" in err and "--oversubscribe" in err and err.count("\n") == 1
    assert magics.session.current_lab is lab and not lab.closed  # the working cluster is untouched
    out, err = magic(sh, "launch tab --strategy Paralax", capsys)
    assert "did you mean 'Parallax'?" in err
    out, err = magic(sh, "launch tab --strategy PS --optimizer adm", capsys)
    assert "--optimizer 'adm': no optimizer or notebook variable" in err and "did you mean 'adam'" in err
    out, err = magic(sh, "launch tab --strategy PS --loss sparse_categorical_crossentropy", capsys)
    assert "loss: a Keras loss (sparse_categorical_crossentropy) for a torch model Sequential" in err
    assert len(magics.session.runs) == runs_before  # refused before anything ran
    out, err = magic(sh, "cluster stop", capsys)
    assert "kept" in out
    assert lab.closed
    # runs belong to the notebook, not to the Lab that made them
    out, err = magic(sh, "compare", capsys)
    assert err == "" and all(r.id in out for r in magics.session.runs)
    # what the predictions rest on, once below the table: these were never calibrated
    assert "predicted from" in out and out.count("predictions: not calibrated") == 1
    # a closed Lab says so, and how to start one
    assert "closed" in repr(lab)
    from distlab.errors import LaunchError

    with pytest.raises(LaunchError, match="closed; start a new one"):
        lab.launch(sh.user_ns["tab"], strategy="AllReduce")
    # its checkpoint folder went with it
    assert not os.path.exists(lab.checkpoint_dir)
    # a magic that starts the cluster on first need binds its Lab to `lab`, as `cluster local` does
    out, err = magic(sh, "launch tab --strategy AllReduce --steps 2 --batch-size 8", capsys)
    assert err == "" and "its Lab is in `lab`" in out, (out, err)
    assert sh.user_ns["lab"] is magics.session.current_lab and not sh.user_ns["lab"].closed


def test_a_lab_that_fails_to_start_leaves_no_checkpoint_folder():
    from distlab.errors import LaunchError
    from distlab.lab import Lab

    pattern = os.path.join(tempfile.gettempdir(), "distlab-ckpt-*")
    before = set(glob.glob(pattern))
    with pytest.raises(LaunchError, match="cannot reach the scheduler"):
        Lab(address="tcp://127.0.0.1:9", timeout=2)
    assert set(glob.glob(pattern)) <= before
