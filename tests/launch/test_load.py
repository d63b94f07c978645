"""Calibration under background load: the host's CPU accounting names other programs, and a disturbed
calibration is not cached."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings

import pytest

from tests.calibrations import two_reference_models


def _sample(t, busy, total, ticks, ours, names=None):
    return {
        "host": "h",
        "time": t,
        "busy": busy,
        "total": total,
        "cpus": 2,
        "cores": 2,
        "ticks": ticks,
        "names": names or {p: f"p{p}" for p in ticks},
        "ours": ours,
    }


def test_host_load_counts_what_other_programs_used():
    from distlab.cluster.load import host_load

    # 10 s on 2 CPUs = 2000 ticks: 1500 busy, of which our worker (pid 10) 400, pid 20 900,
    # the rest unattributed
    before = _sample(0.0, 0, 0, {10: 0, 20: 0, 30: 0}, [10])
    after = _sample(10.0, 1500, 2000, {10: 400, 20: 900, 30: 10}, [10])
    load = host_load(before, after)
    assert load.ours == pytest.approx(0.4) and load.foreign == pytest.approx(1.1)
    assert load.disturbed and load.top[0][:2] == (20, "p20")
    assert "other programs used 1.1 of host h's 2 cores: p20 (pid 20, 0.9 cores)" in load.describe()
    quiet = host_load(before, _sample(10.0, 450, 2000, {10: 400, 20: 20, 30: 10}, [10]))
    assert quiet.foreign == pytest.approx(0.05) and not quiet.disturbed


def test_host_sample_counts_a_workers_children_as_its_own_and_the_notebooks_children_as_others():
    from distlab.cluster.load import host_sample

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import os

        mine = host_sample([os.getpid()])  # this process as a worker: its child is ours
        alone = host_sample([], [os.getpid()])  # this process as the notebook: its child is not
        assert child.pid in mine["ours"] and child.pid not in alone["ours"] and os.getpid() in alone["ours"]
    finally:
        child.kill()
        child.wait()


def test_a_worker_child_that_ran_and_exited_between_samples_is_ours():
    """A native TensorFlow rank is a child process of its worker that may start and end between
    two samples: its CPU time shows in the worker's reaped-children ticks, not as other programs'."""
    import os

    from distlab.cluster.load import host_load, host_sample

    before = host_sample([os.getpid()])
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass",
        ],
        check=True,
    )
    after = host_sample([os.getpid()])
    load = host_load(before, after)
    assert load.ours * load.seconds >= 0.5  # the child's 0.6 s of CPU counted as the cluster's own


def test_a_worker_child_started_before_and_ended_between_samples_counts_only_its_ticks_between():
    """A worker's spare TensorFlow process burns its import's seconds before a measurement, then
    is ended by it and reaped with all its ticks: only those between the samples are the
    cluster's own. Counting all of them hid two busy processes from a native calibration."""
    import os

    from distlab.cluster.load import host_load, host_sample

    burn = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.8: pass\n"
    burn += "sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # its 0.8 s of CPU spent before the first sample
            if host_sample([os.getpid()])["ticks"].get(child.pid, 0) >= 0.75 * os.sysconf("SC_CLK_TCK"):
                break
            time.sleep(0.05)
        before = host_sample([os.getpid()])
        assert before["parent"][child.pid] == os.getpid()
        child.stdin.close()  # it ends, idle meanwhile, and is reaped
        child.wait(timeout=30)
        after = host_sample([os.getpid()])
    finally:
        child.kill()
        child.wait()
    load = host_load(before, after)
    assert load.ours * load.seconds < 0.4, load  # not the 0.8 s it spent before the first sample


def _hogs(n: int) -> list[subprocess.Popen]:
    # busy until killed, or until this test process is gone (a test killed by its timeout would
    # otherwise leave them spinning: two did for 36 minutes, slowing every later test)
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_monitor_sees_one_busy_process_per_core(clean_lab):
    import importlib

    from distlab.cluster.load import LoadMonitor

    # a worker (re)started for this module imports torch._dynamo on a thread (cluster._warm_torch):
    # importing it here waits for that, so the workers are idle while the hogs are measured
    clean_lab.client.run(importlib.import_module, "torch._dynamo")
    hogs = _hogs(2)
    try:
        time.sleep(0.5)
        busy = LoadMonitor(clean_lab.client).start()
        time.sleep(1.5)
        (b,) = busy.stop()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    # the notebook's own children are other programs; the two hogs are named among the busiest
    assert b.disturbed and b.foreign >= 1.5 and b.ours < 0.5
    assert {pid for pid, _, _ in b.top} & {h.pid for h in hogs}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_calibration_beside_busy_processes_warns_and_is_not_cached(clean_lab, tmp_path):
    from distlab.cluster.load import CalibrationWarning

    clean_lab.cache_dir = tmp_path
    hogs = _hogs(2)
    try:
        with warnings.catch_warnings(record=True) as caught, two_reference_models():
            warnings.simplefilter("always")
            cm = clean_lab.calibrate(progress=False, sizes=[4096, 65536])
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    said = [str(w.message) for w in caught if issubclass(w.category, CalibrationWarning)]
    assert len(said) == 1 and "not cached" in said[0] and "run lab.calibrate() again" in said[0]
    assert "other programs used" in said[0] and "\n" not in said[0]
    # two busy processes on 2 cores share them with the calibration's ranks (0.97 cores seen once)
    assert cm.fingerprint["disturbed"] is True and cm.fingerprint["load"][0]["foreign"] >= 0.8
    assert clean_lab.cost_model is cm  # usable in this session
    assert list(tmp_path.glob("calibration-*.json")) == []  # nothing poisoned is cached


def test_workers_that_joined_or_left_during_a_calibration_are_one_warning_naming_them():
    import dataclasses
    import warnings

    from distlab.cluster.load import CalibrationWarning, warn_if_workers_changed
    from distlab.resources import ResourceSpec

    before = dataclasses.replace(ResourceSpec.local(2), addresses=("tcp://h:1", "tcp://h:2"))
    after = dataclasses.replace(ResourceSpec.local(2), addresses=("tcp://h:1", "tcp://h:3"))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warn_if_workers_changed(before, before)
        assert seen == []
        warn_if_workers_changed(before, after)
    assert len(seen) == 1 and issubclass(seen[0].category, CalibrationWarning)
    assert "joined: tcp://h:3; left: tcp://h:2" in str(seen[0].message)
    assert "run lab.calibrate() again" in str(seen[0].message)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_model_measured_beside_busy_processes_warns_is_used_and_is_not_cached(clean_lab, tmp_path, tiny):
    from launch_helpers import Blobs

    from distlab.cluster.load import CalibrationWarning
    from distlab.costmodel.compute import model_key
    from distlab.runs.validate import variables_profile

    clean_lab.cache_dir = tmp_path
    hogs = _hogs(2)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cm = clean_lab.measure_model(tiny, data=Blobs(256), batch_size=8, progress=False)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    said = [str(w.message) for w in caught if issubclass(w.category, CalibrationWarning)]
    assert len(said) == 1 and "not cached" in said[0] and "other programs used" in said[0], said
    assert model_key(variables_profile(tiny)) in cm.compute  # used for this session's predictions
    assert list(tmp_path.glob("local-steps-*.json")) == []  # never cached
