"""The artifact's jobs with distlab's step model: the model they read, and a job that switches to it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import distlab.sched as sched
from distlab.costmodel.fit import fit_measurements, predict_measurements
from distlab.sched import artifact
from distlab.sched.artifact_distlab import DistlabGoodputFunction, DistlabJob


def test_the_goodput_function_reads_distlabs_fitted_step_with_accumulation():
    df = artifact.application("cifar10").placements
    rows = df[df.num_replicas <= 4][["num_nodes", "num_replicas", "local_bsz", "step_time"]]
    _, theta, _ = fit_measurements(rows)
    fn = DistlabGoodputFunction(theta, (1.0, 1.0), 128)
    at = pd.DataFrame({"num_nodes": [2], "num_replicas": [8], "local_bsz": [64]})
    step = predict_measurements(theta, at)[0]
    assert fn.throughput(2, 8, 64, 0) == pytest.approx(8 * 64 / step)
    # one extra micro-batch adds the step's compute part, not a second synchronisation
    assert 8 * 64 * 2 / fn.throughput(2, 8, 64, 1) - step == pytest.approx(
        predict_measurements(theta, at.assign(num_replicas=1, num_nodes=1))[0], rel=1e-6
    )


def test_a_job_switches_to_distlabs_model_once_it_has_measured_two_batches():
    job = DistlabJob("cifar10-0", 0.0, artifact.application("cifar10"))
    assert job.theta is None and job.speedup_fn() is None  # nothing measured: speedup = replicas
    sched.simulate([job], "goodput", sched.SimCluster(2, 4), limit=2 * 3600)
    assert len({k[2] for k in job.profile}) >= 2 and job.theta is not None
    assert isinstance(job.goodput_fn(), DistlabGoodputFunction)
    speedup = job.speedup_fn()
    assert speedup is not None and speedup(np.array([1]), np.array([1]))[0] == pytest.approx(1.0)
    assert speedup(np.array([2]), np.array([8]))[0] > 1.0
