"""A Slurm worker's job cancelled mid-run (``scancel``): the run resumes on the survivor from its
checkpoint, a new job replaces the lost one, and the run grows back onto it and finishes on 2
ranks, every step once along its history and every sample of an epoch read once."""

from __future__ import annotations

import subprocess
import sys
import time

import cloudpickle
import pytest
import torch
from torch import nn

import distlab as dl
from distlab.cluster.slurm import SlurmSpec, squeue_states, start_slurm
from tests.polling import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}
BATCH = 16


class SlowBlobs(torch.utils.data.Dataset):
    """Gaussian blobs (class k around centre k) whose every sample takes 3 ms to read: a step takes
    at least 48 ms at any world size, so the run's 600 steps outlast a replacement job's start
    (about 10 s here: the loss seen, sbatch, the worker's imports)."""

    def __init__(self, n: int = 512) -> None:
        g = torch.Generator().manual_seed(0)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.x = (torch.randn(4, 8, generator=g) * 3)[self.y] + torch.randn(n, 8, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.003)
        return self.x[i], self.y[i]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def test_a_cancelled_job_is_replaced_and_the_run_finishes_on_2_ranks_at_the_exact_step(slurm, tmp_path):
    jobs = start_slurm(2, SlurmSpec(memory="2GB"), timeout=120, log_dir=tmp_path, progress=False)
    runs: list = []
    try:
        lab = dl.Lab(client=jobs.client, timeout=60)
        # what Lab(cluster="slurm") starts itself (lab.py's hook); here on jobs the test holds
        keeper = jobs.keep_workers(lambda: list(runs), lambda: lab.workers, within=120)
        every, steps = 10, 600
        run = lab.launch(
            _mlp(), "AllReduce", steps=steps, data=SlowBlobs(), batch_size=BATCH, checkpoint_every=every
        )
        runs.append(run)
        poll_for(lambda: run.steps_done >= 3 * every + 5, 120, f"step {3 * every + 5}")
        (job,) = [j for j, addr in jobs.workers_of_jobs().items() if addr == run.workers[1]]
        subprocess.run(["scancel", job], check=True, timeout=30)
        assert run.join(360), f"the run did not end: {run.status}, keeper: {keeper.error}"
        assert run.status == "finished", run.error
        assert keeper.replaced == 1 and keeper.grown == 1 and keeper.error is None, keeper.error
        assert job not in jobs.job_ids and len(jobs.submitted) == 3

        r0 = run.metrics[run.metrics["rank"] == 0]
        worlds = r0.groupby("restart")["world"].agg(set).to_dict()
        assert worlds == {0: {2}, 1: {1}, 2: {2}} and run.world == 2, worlds
        first = r0.groupby("restart")["step"].min().to_dict()
        last = r0.groupby("restart")["step"].max().to_dict()
        # the loss: resumed from the newest checkpoint before the cancel, not from scratch
        assert first[1] % every == 0 and 3 * every <= first[1] <= last[0] + 1, (first, last)
        # the grow back: paused at a step with its checkpoint, resumed at the next one (nothing re-run)
        assert first[2] == last[1] + 1, (first, last)
        # along the run's history (each step's newest record) every step ran once, and each advanced
        # the data position by its own global batch from 0: every sample of an epoch read once
        chain = r0.sort_values("restart").groupby("step").last().sort_index()
        assert list(chain.index) == list(range(steps))
        assert (chain["samples"].to_numpy() == (chain["world"].to_numpy() * BATCH).cumsum()).all()
        losses = run.losses
        assert losses.iloc[-20:].mean() < 0.5 * losses.iloc[:20].mean(), losses
        lab.close()
    finally:
        jobs.close()
    assert {j: s for j, (s, _) in squeue_states(jobs.submitted).items() if s in ACTIVE} == {}
