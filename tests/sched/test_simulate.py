"""The simulator on small workloads: completion times to check by hand, refused policies, artifact jobs."""

from __future__ import annotations

import numpy as np
import pytest

import distlab.sched as sched
from distlab.sched import artifact


def sublinear(n, r):
    return r / (1 + 0.3 * (r - 1))


def test_one_linear_job_waits_a_round_restarts_once_and_runs_on_all_four_workers():
    job = sched.WorkJob("only", arrival=0.0, work=3600.0, max_replicas=4)
    result = sched.simulate([job], "goodput", sched.SimCluster(1, 4))
    # placed at the first round (60 s), 30 s restart, then 3600 s of work at 4x
    assert result.jobs.jct[0] == pytest.approx(60 + 30 + 900)
    assert result.summary()["unfinished"] == 0
    assert result.makespan == pytest.approx(990)
    assert 0.9 < result.utilisation <= 1.0


def test_sharing_beats_a_queue_when_jobs_scale_sublinearly():
    def workload():
        return [sched.WorkJob(f"j{i}", 0.0, 7200.0, sublinear, max_replicas=4) for i in range(4)]

    cluster = sched.SimCluster(1, 4)
    shared = sched.simulate(workload(), "goodput", cluster)
    queued = sched.simulate(workload(), "fifo", cluster)
    # FIFO runs them one after another at speedup 2.1; sharing runs all four at speedup 1
    assert shared.avg_jct < 0.9 * queued.avg_jct
    assert queued.p99_jct > shared.p99_jct
    assert set(shared.summary()) == {"avg_jct", "p99_jct", "makespan", "utilisation", "unfinished"}


class OverCapacityEveryOtherRound:
    """A user's policy that gives one worker to two jobs on odd rounds."""

    def __init__(self):
        self.rounds = 0

    def allocate(self, jobs, workers, previous):
        self.rounds += 1
        first = sorted(workers)[0]
        if self.rounds % 2 == 0:
            return {j.name: (first,) for j in jobs}
        return {j.name: (w,) for j, w in zip(jobs, sorted(workers))}


def test_a_refused_allocation_keeps_the_previous_one_and_the_jobs_still_finish():
    policy = OverCapacityEveryOtherRound()
    assert isinstance(policy, sched.Policy)
    jobs = [sched.WorkJob(f"j{i}", 0.0, 600.0) for i in range(2)]
    result = sched.simulate(jobs, policy, sched.SimCluster(1, 2))
    assert result.refused >= 1
    assert result.jobs.restarts.tolist() == [0, 0]  # a refused round moved nobody
    assert result.summary()["unfinished"] == 0


def test_an_interval_that_is_not_positive_is_refused():
    with pytest.raises(sched.SchedulerError, match="interval=0"):
        sched.simulate([sched.WorkJob("a", 0.0, 1.0)], "fifo", sched.SimCluster(1, 1), interval=0)


def test_the_artifact_traces_give_the_measured_step_time_on_a_measured_placement():
    app = artifact.application("cifar10")
    rows = app.placements[app.placements.placement == 22]  # two hosts, two replicas each
    row = rows.iloc[len(rows) // 2]
    step, sync = app.throughput((2, 2), int(row.local_bsz))
    assert (step, sync) == pytest.approx((row.step_time, row.sync_time))
    assert artifact.reference()["pollux"]["avgs"]["workload-6"] == pytest.approx(2446.13125)


def test_an_artifact_job_fits_its_speedup_from_what_it_ran_and_finishes():
    job = artifact.ArtifactJob("bert-0", 0.0, artifact.application("bert"))
    assert job.spec(0.0).speedup is None  # nothing measured: speedup = replicas
    result = sched.simulate([job], "goodput", sched.SimCluster(2, 4))
    assert result.summary()["unfinished"] == 0
    speedup = job.speedup_fn()
    assert speedup is not None and speedup(np.array([1]), np.array([1]))[0] == pytest.approx(1.0)
    assert job.spec(result.jobs.completion[0]).max_replicas == min(2 * max(k[1] for k in job.profile), 64)
