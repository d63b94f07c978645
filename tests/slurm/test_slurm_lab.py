"""A Lab on a real one-node Slurm (tests/slurm/conftest.py): workers as Slurm jobs train a run,
``close`` cancels every job, and Slurm's refusals and a queue that does not move are one line."""

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
from distlab.errors import LaunchError
from tests.polling import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}


def _active(job_ids) -> dict[str, str]:
    """squeue's state of those of ``job_ids`` not ended."""
    return {j: s for j, (s, _) in squeue_states(job_ids).items() if s in ACTIVE}


def _blobs(n: int = 512) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable toy classification set (class k: a Gaussian blob around centre k)."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (n,), generator=g)
    x = (torch.randn(4, 8, generator=g) * 3)[y] + torch.randn(n, 8, generator=g)
    return x, y


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


def _spawns_a_child() -> bool:
    """(worker) A rank's DataLoader workers are child processes: a daemonic worker may not have any."""
    import multiprocessing
    import os

    # fork: nothing to unpickle in the child (start() refuses in a daemonic process whatever the context)
    child = multiprocessing.get_context("fork").Process(target=os.getpid)
    child.start()
    child.join(60)
    return child.exitcode == 0


def _gloo_interface(rank: int, world: int, addr: str, port: int) -> tuple[str | None, str]:
    """(rank) The interface this rank binds gloo to, and its worker's host."""
    from distlab.runtime.process_group import bind_interface, rank_host

    return bind_interface(), rank_host()


def test_two_workers_start_as_slurm_jobs_and_a_lab_trains_on_them_until_close_cancels_them(slurm, tmp_path):
    jobs = start_slurm(2, SlurmSpec(memory="2GB"), timeout=120, log_dir=tmp_path, progress=False)
    try:
        ids = jobs.job_ids
        assert len(ids) == 2 and _active(ids) == dict.fromkeys(ids, "RUNNING")
        lab = dl.Lab(client=jobs.client, timeout=60)
        assert lab.resources.world == 2
        # non-daemonic workers, though dask-jobqueue forwards none of this process's Dask config
        assert set(jobs.client.run(_spawns_a_child).values()) == {True}
        # gloo binds where the scheduler reaches each worker (not loopback's name lookup)
        for name, host in lab.run_ranks(_gloo_interface):
            assert host.startswith("127.") or name is not None, (name, host)
        for strategy in ("AllReduce", "Gossip"):
            run = lab.launch(
                _mlp(), strategy, steps=60, data=_blobs(), batch_size=16, optimizer="sgd", lr=0.1, block=True
            )
            assert run.status == "finished" and run.world == 2, run.error
            losses = run.losses
            assert losses.iloc[-5:].mean() < 0.5 * losses.iloc[:5].mean(), (strategy, losses)
        lab.close()
    finally:
        jobs.close()
    assert _active(ids) == {}  # squeue lists none of them once closed


def test_a_partition_that_does_not_exist_is_slurms_message_in_one_line_and_leaves_no_job(slurm, tmp_path):
    before = set(squeue_states_all())
    with pytest.raises(LaunchError) as err:
        start_slurm(1, SlurmSpec(partition="nope"), timeout=30, log_dir=tmp_path, progress=False)
    text = str(err.value)
    assert "invalid partition specified: nope" in text and "sinfo lists" in text, text
    assert "\n" not in text
    assert set(squeue_states_all()) - before == set()


def test_a_job_slurm_rejects_is_its_own_message_in_one_line(slurm, tmp_path):
    with pytest.raises(LaunchError, match="Slurm refused the worker job: Memory specification") as err:
        start_slurm(1, SlurmSpec(memory="100TB"), timeout=30, log_dir=tmp_path, progress=False)
    assert "\n" not in str(err.value)


def test_a_job_slurm_will_never_start_fails_at_once_naming_its_reason(slurm, tmp_path):
    # accepted, but more CPUs than the partition's node has: Slurm holds it PENDING (PartitionConfig)
    started = time.monotonic()
    with pytest.raises(LaunchError, match=r"will not start worker job \d+: PENDING \(PartitionConfig\)"):
        start_slurm(1, SlurmSpec(cores=512), timeout=60, log_dir=tmp_path, progress=False)
    assert time.monotonic() - started < 20  # not the whole timeout
    poll_for(lambda: not squeue_states_all(), 30, "no job of the failed start in squeue")


def test_workers_that_do_not_join_in_time_name_their_jobs_and_slurm_states(slurm, tmp_path):
    # the node has 2 CPUs: a third one-core worker waits for one (squeue's reason: Resources)
    started = time.monotonic()
    with pytest.raises(LaunchError) as err:
        start_slurm(3, SlurmSpec(memory="1GB"), timeout=20, log_dir=tmp_path, progress=False)
    text = str(err.value)
    assert "2 of 3 workers joined within 20 s" in text, text
    pending = text.split("waiting: ")[1].split(";")[0]
    assert "PENDING (Resources)" in pending and pending.split()[0].isdigit(), text
    assert time.monotonic() - started < 60
    # every job it submitted was cancelled before the error
    poll_for(lambda: not _active(squeue_states_all()), 30, "no job of the failed start in squeue")


def squeue_states_all() -> dict[str, str]:
    """Every job of this user squeue lists as not ended."""
    done = subprocess.run(["squeue", "-h", "-o", "%i|%T"], capture_output=True, text=True, timeout=30)
    pairs = (line.split("|") for line in done.stdout.split())
    return {j: s for j, s in pairs if s in ACTIVE}


def test_a_worker_job_cancelled_mid_run_resumes_on_the_survivor_and_heal_submits_a_replacement(
    slurm, tmp_path
):
    jobs = start_slurm(2, SlurmSpec(memory="2GB"), timeout=120, log_dir=tmp_path, progress=False)
    try:
        lab = dl.Lab(client=jobs.client, timeout=60)
        every = 20
        run = lab.launch(
            _mlp(), "AllReduce", steps=100_000, data=_blobs(), batch_size=16, checkpoint_every=every
        )
        poll_for(lambda: run.steps_done >= every + 10, 120, f"step {every + 10}")
        victim = lab.workers[1]
        (job,) = [j for j, addr in jobs.workers_of_jobs().items() if addr == victim]
        subprocess.run(["scancel", job], check=True, timeout=30)
        poll_for(lambda: run.restarts == 1 and run.world == 1, 120, "the run to resume on the survivor")
        poll_for(lambda: run.metrics.query("restart == 1")["step"].nunique() >= 5, 60, "resumed steps")
        run.cancel()
        resumed = run.metrics.query("restart == 1")
        assert set(resumed["world"]) == {1}
        first = int(resumed["step"].min())
        assert first >= every and first % every == 0  # from a checkpoint, not from scratch
        # the Lab's worker count comes back through a new job
        assert jobs.heal(within=120) == 1
        assert lab.resources.world == 2 and job not in jobs.job_ids
        assert _active(jobs.job_ids) == dict.fromkeys(jobs.job_ids, "RUNNING")
        again = lab.launch(_mlp(), "AllReduce", steps=10, data=_blobs(), batch_size=16, block=True)
        assert again.status == "finished" and again.world == 2, again.error
        lab.close()
    finally:
        jobs.close()
    assert _active(jobs.submitted) == {}


@pytest.mark.skipif(
    "cluster" not in __import__("inspect").signature(dl.Lab).parameters,
    reason="dl.Lab has no cluster= yet (lab.py's Slurm lines: issue 59)",
)
def test_a_slurm_lab_trains_lists_its_jobs_submits_a_new_one_for_a_cancelled_job_and_cancels_all_on_close(
    slurm, tmp_path
):
    lab = dl.Lab(cluster="slurm", workers=2, memory="2GB", timeout=120, cache_dir=tmp_path)
    try:
        jobs = lab.cluster.jobs
        assert lab.resources.world == 2 and _active(jobs.job_ids) == dict.fromkeys(jobs.job_ids, "RUNNING")
        run = lab.launch(_mlp(), "AllReduce", steps=30, data=_blobs(), batch_size=16, block=True)
        assert run.status == "finished" and run.world == 2, run.error
        gone = jobs.job_ids[1]
        subprocess.run(["scancel", gone], check=True, timeout=30)
        if jobs.keeper is None:  # the next launch submits a job for it
            poll_for(lambda: lab.lost_workers == 1, 60, "the Lab to see its worker gone")
            assert "1 of 2 Slurm workers running" in repr(lab)
        else:  # the Lab's keeper (lab.py's keep_workers hook) submits one by itself
            poll_for(lambda: len(jobs.submitted) == 3 and lab.lost_workers == 0, 120, "a new job's worker")
        again = lab.launch(_mlp(), "Gossip", steps=30, data=_blobs(), batch_size=16, block=True)
        assert again.status == "finished" and again.world == 2, again.error  # on a new job
        assert gone not in jobs.job_ids and len(jobs.submitted) == 3
    finally:
        lab.close()
    assert _active(jobs.submitted) == {}
