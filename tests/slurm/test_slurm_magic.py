"""``%distlab cluster slurm N`` through a real IPython shell against the one-node Slurm: the jobs in
squeue, a ``%distlab launch`` that trains, ``%distlab cluster stop`` cancelling them; its bad input
one line; and the walltime warning against the jobs' real start time."""

from __future__ import annotations

import subprocess
import warnings

import pytest
import torch
from torch import nn

from distlab.cluster.slurm import WalltimeWarning, check_walltime, squeue_states
from tests.notebook.conftest import magic_shell, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}


@pytest.fixture
def shell():
    with magic_shell() as (sh, _):
        yield sh


def _mine() -> dict[str, str]:
    """squeue's state of every job of this user not ended."""
    done = subprocess.run(["squeue", "-h", "-o", "%i|%T"], capture_output=True, text=True, timeout=30)
    pairs = (line.split("|") for line in done.stdout.split())
    return {j: s for j, s in pairs if s in ACTIVE}


def _blobs(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable toy classification set (class k: a Gaussian blob around centre k)."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (n,), generator=g)
    x = (torch.randn(4, 8, generator=g) * 3)[y] + torch.randn(n, 8, generator=g)
    return x, y


def test_the_magic_starts_the_lab_on_slurm_jobs_trains_on_them_and_stop_cancels_them(slurm, shell, capsys):
    before = set(_mine())
    out, err = run(shell, "cluster slurm 2 --memory 2GB --walltime 10", capsys)
    assert "the cluster's Lab is in `lab`" in out and "distlab:" not in err, (out, err)
    # stderr holds the wait's bar (queued, running, joined), which shows once the wait lasted a second
    lines = [line for line in err.replace("\r", "\n").split("\n") if line.strip()]
    assert all(line.startswith("Slurm workers") for line in lines), err
    lab = shell.user_ns["lab"]
    jobs = lab.cluster.jobs
    ids = jobs.job_ids
    assert len(ids) == 2 and lab.resources.world == 2
    assert {j: s for j, s in _mine().items() if j not in before} == dict.fromkeys(ids, "RUNNING")
    # the jobs ask for the walltime given: 10 minutes, squeue's TIME_LIMIT
    limits = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%l"], capture_output=True, text=True)
    assert limits.stdout.split() == ["10:00", "10:00"], limits.stdout

    # the walltime check against the jobs' real start: an hour's run does not fit, 5 s does
    started = jobs.started_at()
    assert started is not None
    with pytest.warns(WalltimeWarning, match=r"predicted to take 1 h 00 min, but .* 9 min \d\d s .* left"):
        check_walltime(jobs.spec.walltime, started, 3600.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_walltime(jobs.spec.walltime, started, 5.0) is None

    torch.manual_seed(0)
    shell.user_ns["m"] = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    shell.user_ns["d"] = _blobs()
    out, err = run(
        shell,
        "launch m --strategy AllReduce --steps 60 --data d --batch-size 16 --optimizer sgd --lr 0.1",
        capsys,
    )
    r = shell.user_ns["run"]
    assert r.status == "finished" and r.world == 2, (r.error, err)
    losses = r.losses
    assert losses.iloc[-5:].mean() < 0.5 * losses.iloc[:5].mean(), losses

    out, err = run(shell, "cluster stop", capsys)
    assert "cluster stopped" in out and err == "", (out, err)
    assert {j: s for j, (s, _) in squeue_states(ids).items() if s in ACTIVE} == {}


def test_a_partition_slurm_does_not_have_is_its_message_in_one_line_with_the_magics_option(
    slurm, shell, capsys
):
    before = set(_mine())
    out, err = run(shell, "cluster slurm 1 --partition nope", capsys)
    assert err.startswith("distlab: %distlab cluster slurm: Slurm refused the worker job: "), err
    assert err.count("\n") == 1
    assert "invalid partition specified: nope" in err and "--partition 'nope'; sinfo lists debug" in err, err
    assert "lab" not in shell.user_ns or shell.user_ns["lab"] is None
    assert set(_mine()) - before == set()


@pytest.mark.parametrize(
    "line, words",
    [
        ("cluster slurm", "slurm N: N must be a positive number of worker jobs"),
        ("cluster slurm 0", "slurm N: N must be a positive number of worker jobs, got 0"),
        ("cluster local 1 --partition gpu", "cluster local: --partition is a Slurm job option"),
        ("cluster slurm 1 --memory lots", "--memory 'lots' is not a size"),
        ("cluster slurm 1 --gpus -1", "--gpus must be an integer >= 0, got -1"),
        ("cluster slurm 1 --cores 0", "--cores must be an integer >= 1, got 0"),
        ("cluster slrum 2", "did you mean 'slurm'?"),
    ],
)
def test_bad_slurm_input_is_one_line_naming_the_magics_option(shell, capsys, line, words):
    out, err = run(shell, line, capsys)
    assert words in err and err.count("\n") == 1 and err.startswith("distlab: "), err
    assert "Traceback" not in out + err


def test_no_sbatch_here_is_one_line_naming_the_extra_and_make_slurm_up(shell, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing of Slurm's on it
    out, err = run(shell, "cluster slurm 2", capsys)
    assert err.startswith("distlab: %distlab cluster slurm: no `sbatch` on this machine's PATH"), err
    assert "distlab[slurm]" in err and "make slurm-up" in err and err.count("\n") == 1
