"""lab.scale(n): a running job pauses at a step, the cluster changes, and it resumes on the new
workers at the same data position (every sample of an epoch seen once across resizes)."""

from __future__ import annotations

import itertools
import sys

import cloudpickle
import pytest
import torch
from launch_helpers import Blobs, TinyNet

from distlab.errors import LaunchError
from distlab.lab import Lab
from tests.polling import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(2, timeout=60, cache_dir=tmp_path_factory.mktemp("cache")) as lab:
        yield lab


@pytest.mark.timeout(240)
def test_a_run_resized_from_2_to_1_to_2_workers_sees_every_sample_of_each_epoch_once(lab):
    torch.manual_seed(0)
    steps = 100_000  # more than it runs: cancelled once it has trained on 2, 1 and 2 workers
    run = lab.launch(TinyNet(), strategy="AllReduce", steps=steps, data=Blobs(n=100), batch_size=10)
    poll_for(lambda: len(run.metrics) and run.metrics["step"].max() >= 20, 60, "the run to reach step 20")
    assert lab.scale(1).world == 1

    def steps_in(restart: int) -> int:
        m = run.metrics
        return int(((m["restart"] == restart) & (m["rank"] == 0)).sum())

    poll_for(lambda: steps_in(1) >= 20, 60, "20 steps on 1 worker")
    assert lab.scale(2).world == 2
    poll_for(lambda: steps_in(2) >= 20, 60, "20 steps on 2 workers again")
    run.cancel()
    assert run.status == "cancelled" and run.error is None
    r0 = run.metrics[run.metrics["rank"] == 0].sort_values("step")
    assert list(r0["step"]) == list(range(len(r0)))  # every step once: nothing re-run, nothing skipped
    assert [w for w, _ in itertools.groupby(r0["world"])] == [2, 1, 2] and run.restarts == 2
    # each step advanced the data position by its own global batch, from 0: every position once,
    # so each epoch of 100 samples is read exactly once, at every world size
    gb = r0["world"].to_numpy() * 10
    assert (r0["samples"].to_numpy() == gb.cumsum()).all()


def test_scaling_to_zero_workers_or_an_attached_cluster_is_one_error(lab):
    with pytest.raises(LaunchError, match=r"lab.scale\(0\): a Lab needs at least 1 worker"):
        lab.scale(0)
    other = Lab(client=lab.client)
    with pytest.raises(LaunchError, match="attached to a cluster it did not start; scale that cluster"):
        other.scale(3)


@pytest.mark.timeout(240)
def test_an_adaptive_run_keeps_its_noise_estimate_and_progress_across_a_resize(lab):
    import distlab as dl

    lab.scale(2)
    torch.manual_seed(0)
    model = TinyNet()
    st = dl.strategy.build("AdaptiveBatch", dl.profile(model, batch_size=8), lab.resources, batch_size=8)
    run = lab.launch(model, strategy=st, steps=100_000, data=Blobs(n=256))

    def rows(restart: int):
        m = run.metrics
        return m[(m["restart"] == restart) & (m["rank"] == 0)].sort_values("step")

    poll_for(lambda: len(rows(0)) >= 60, 60, "60 steps before the resize")
    lab.scale(1)
    poll_for(lambda: len(rows(1)) >= 10, 60, "10 steps after the resize")
    run.cancel()
    before, after = rows(0), rows(1)
    assert after["world"].iloc[0] == 1
    assert after["progress"].iloc[0] > before["progress"].iloc[-1]  # progress carried over, still growing
    assert after["samples"].iloc[0] == before["samples"].iloc[-1] + after["global_batch"].iloc[0]
    # the estimate was restored, not restarted: a moving average over thousands of samples moves
    # little in one step, a fresh one-step estimate would be anything
    assert after["noise_scale"].iloc[0] == pytest.approx(before["noise_scale"].iloc[-1], rel=0.3)
