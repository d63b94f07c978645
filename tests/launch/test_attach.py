"""Attaching to a scheduler whose workers come and go: started with the ``dask`` command line,
as on a cluster of hosts, here on loopback (the two-host emulation is test_two_hosts.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

from distlab.errors import LaunchError
from distlab.lab import Lab

DASK = str(Path(sys.executable).with_name("dask"))
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/
HERE = Path(__file__).resolve().parent
# the scheduler unpickles the task graph too: it imports this module by the name the test gave it
PATH = os.pathsep.join([str(HERE.parents[1]), str(HERE), os.environ.get("PYTHONPATH", "")])
ENV = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False", "PYTHONPATH": PATH}


class Scheduler:
    """A ``dask scheduler`` and the ``dask worker`` processes a test adds to it; all killed at exit."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        info = tmp / "scheduler.json"
        self._start(
            "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(info)
        )
        from tests.polling import poll_for  # here, not at the top: this module goes to the workers by value

        poll_for(info.exists, 60, "the dask scheduler to write its file", interval=0.2)
        self.address = json.loads(info.read_text())["address"]

    def _start(self, *args: str) -> subprocess.Popen:
        log = open(self.tmp / f"{len(self.procs)}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [DASK, *args], stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def add_worker(self) -> subprocess.Popen:
        return self._start(
            "worker", self.address, "--host", "127.0.0.1", "--nthreads", "1", "--no-dashboard", "--no-nanny"
        )

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


@pytest.fixture
def scheduler(tmp_path):
    s = Scheduler(tmp_path)
    yield s
    s.close()


def test_an_attached_lab_waits_for_workers_that_join_late(scheduler, tmp_path):
    scheduler.add_worker()
    threading.Timer(2.0, scheduler.add_worker).start()  # a second host's worker, still starting
    with Lab(address=scheduler.address, workers=2, timeout=60, cache_dir=tmp_path) as lab:
        assert lab.resources.world == 2


def test_workers_that_never_join_are_one_error_saying_how_many_came(scheduler, tmp_path):
    scheduler.add_worker()
    t0 = time.monotonic()
    with pytest.raises(
        LaunchError,
        match=r"1 of 3 worker\(s\) joined .* within 3 s; give workers=1, start more \(dask worker tcp://",
    ):
        Lab(address=scheduler.address, workers=3, timeout=3, cache_dir=tmp_path)
    assert time.monotonic() - t0 < 20


def test_a_scheduler_without_workers_is_one_error_naming_the_command_to_start_them(scheduler, tmp_path):
    with pytest.raises(
        LaunchError, match=rf"no worker joined .*start some \(dask worker {scheduler.address}\)"
    ):
        Lab(address=scheduler.address, timeout=2, cache_dir=tmp_path)


def _sleepy(rank, world, master_addr, master_port, seconds):
    time.sleep(seconds)
    return rank


def test_a_worker_leaving_while_ranks_run_is_one_launch_error_not_a_hang(scheduler, tmp_path):
    scheduler.add_worker()
    leaving = scheduler.add_worker()
    with Lab(address=scheduler.address, workers=2, timeout=30, cache_dir=tmp_path) as lab:
        assert lab.run_ranks(_sleepy, 0.1) == [0, 1]
        threading.Timer(2.0, lambda: os.killpg(leaving.pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        with pytest.raises(
            LaunchError, match=r"left the cluster while its ranks ran; the Lab has 1 worker\(s\) now"
        ):
            lab.run_ranks(_sleepy, 60.0)
        assert time.monotonic() - t0 < 45  # not the 60 s the ranks would have slept
        assert lab.resources.world == 1
