"""An in-process Dask cluster for launch tests, with a timeout and leak checks (after dask's gen_cluster)."""

from __future__ import annotations

import sys
import time

import cloudpickle
import pytest
import torch
from launch_helpers import Blobs, TinyNet

from tests.calibrations import calibration_load_ignored

# Test modules are not importable on the workers: ship their functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def spmd_workers(client) -> dict:
    from distlab.cluster.spmd import workers_info

    return workers_info(client)


def _leaks(lab) -> dict:
    from distlab.cluster import spmd

    return spmd.active_on_cluster(lab.client)


@pytest.fixture(scope="module")
def lab(lab):
    """The session's 2-worker embedded Lab (tests/conftest.py), whole when the module starts."""
    _wait_for_workers(lab)
    return lab


def _wait_for_workers(lab, n: int = 2, within: float = 60) -> None:
    """A killed or restarted worker comes back through its nanny, cold (a nanny that gave up is
    replaced): the Lab makes the cluster whole, as it does before every launch."""
    from distlab.cluster.local import heal_local_cluster

    heal_local_cluster(lab.cluster.local, lab.client, within=within)
    nannies = {name: str(w.status) for name, w in lab.cluster.local.workers.items()}
    assert len(spmd_workers(lab.client)) == n, (
        f"the cluster has {len(spmd_workers(lab.client))} workers, not {n}; nannies: {nannies}"
    )


@pytest.fixture
def clean_lab(lab):
    """The module's Lab, checked before and after the test: whole, no rank left training, no run pending."""
    _wait_for_workers(lab)
    assert _leaks(lab) == {}, "a previous test left ranks training"
    yield lab
    deadline = time.monotonic() + 10
    while _leaks(lab) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leaks(lab) == {}, "ranks still training 10 s after the test ended"
    for run in lab.history:
        assert run.done, f"run {run.id} still {run.status} after the test"


@pytest.fixture
def load_ignored():
    """For tests of fitting and caching: a calibration cached whatever else the machine runs
    (``tests.conftest.calibration_load_ignored``)."""
    with calibration_load_ignored():
        yield


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return TinyNet()


@pytest.fixture
def blobs():
    return Blobs()
