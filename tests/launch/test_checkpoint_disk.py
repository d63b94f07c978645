"""Checkpoints that do not fill the disk: one per running run, none once it ended, and the folders
of a killed kernel removed by the next Lab (runs/ckpt_dirs.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from launch_helpers import allreduce_strategy

from distlab.runs import ckpt_dirs
from distlab.runs.report import run_card
from distlab.runtime import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _files(folder):
    return sorted(p.name for p in folder.rglob("ckpt-*.pt"))


def test_finished_runs_leave_no_checkpoint_and_the_card_says_when_the_last_was_taken(clean_lab, tiny, blobs):
    runs = []
    for _ in range(3):
        st = allreduce_strategy(tiny, clean_lab.resources)
        run = clean_lab.launch(tiny, strategy=st, steps=12, data=blobs, checkpoint_every=3)
        runs.append(run.wait(120, progress=False))
    assert [r.status for r in runs] == ["finished"] * 3
    assert _files(clean_lab.checkpoint_dir) == []  # five runs used to leave 905 MB: three files each
    for r in runs:
        assert r.last_checkpoint is not None and r.last_checkpoint["step"] in (9, 12), r.last_checkpoint
        assert r.checkpoint is None
        assert "removed when the run ended" in run_card(r)
    assert (
        "checkpoints in" in clean_lab._repr_html_()
        and str(clean_lab.checkpoint_dir) in clean_lab._repr_html_()
    )


def test_a_run_keeps_one_checkpoint_while_it_can_resume(tmp_path):
    for step in (3, 6, 9):
        checkpoint.save(tmp_path, {"step": step, "model": {"w": torch.zeros(4)}})
    assert _files(tmp_path) == ["ckpt-000000009.pt"]
    info = ckpt_dirs.last(tmp_path)
    assert info is not None and info["step"] == 9 and "ago" in ckpt_dirs.describe(info, ended=False)


def test_the_next_lab_removes_the_folders_a_killed_kernel_left_and_keeps_live_ones(tmp_path):
    code = (
        "import sys, time; from distlab.runs import ckpt_dirs; "
        f"d = ckpt_dirs.make_own({str(tmp_path)!r}); (d / 'r1').mkdir(); "
        "(d / 'r1' / 'ckpt-000000010.pt').write_bytes(b'x' * 1000); print(d, flush=True); time.sleep(600)"
    )
    killed = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    alive = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        dead_dir, live_dir = killed.stdout.readline().strip(), alive.stdout.readline().strip()
        os.kill(killed.pid, signal.SIGKILL)  # no finalizer runs: the folder stays behind
        killed.wait(10)
        other = tmp_path / "distlab-ckpt-notours"  # no owner file: another tool's or an older distlab's
        other.mkdir()
        assert os.path.isdir(dead_dir)
        mine = ckpt_dirs.make_own(tmp_path)  # what dl.Lab() does for its own folder
        assert not os.path.exists(dead_dir)
        assert os.path.isdir(live_dir) and other.is_dir() and mine.is_dir()
        owner = json.loads((mine / ckpt_dirs.OWNER).read_text())
        assert owner["pid"] == os.getpid()
    finally:
        for p in (killed, alive):
            if p.poll() is None:
                p.kill()
            p.wait(10)
