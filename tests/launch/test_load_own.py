"""The load check counts the cluster's own processes as its own: a scheduler in a process of its own,
and a worker that replaced a lost one while distlab measured, are not "other programs"."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys

from distlab.cluster.load import LoadMonitor, _pid_info, _proc_ticks

BURN = 0.6  # CPU seconds a stand-in process spends before it sleeps
TICK = os.sysconf("SC_CLK_TCK")


def _busy() -> subprocess.Popen:
    """A process that waits for a line on stdin, spends ``BURN`` CPU seconds, says so on stdout, then
    idles until killed. It burns only when told: CPU it spent starting up, before the monitor's
    first sample, is not in the window (a CI run failed on 0.549 of 0.55 seconds that way)."""
    code = (
        "import sys, time\nsys.stdin.readline()\nt = time.process_time()\n"
        f"while time.process_time() - t < {BURN}: pass\nprint('burned', flush=True)\ntime.sleep(60)"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _burn(proc: subprocess.Popen) -> None:
    """Start ``proc`` burning and wait (30 s at most) until it says it has."""
    proc.stdin.write("go\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    assert ready and proc.stdout.readline().strip() == "burned", "the stand-in process did not burn in 30 s"
    assert _proc_ticks(proc.pid)[1] / TICK >= BURN - 0.05


class _Client:
    """A Dask client as ``LoadMonitor`` uses it, over stand-in processes of this host: ``workers``
    (address -> pid, each a child of this process, as an embedded cluster's nannies start them)
    and the ``scheduler``'s pid. The samples are taken here: they read the whole host anyway."""

    def __init__(self, workers: dict[str, int], scheduler: int) -> None:
        self.workers, self.scheduler = workers, scheduler

    def run(self, fn, *args, workers=None):
        if fn is _pid_info:
            return {a: (socket.gethostname(), pid, os.getpid()) for a, pid in self.workers.items()}
        return {a: fn(*args) for a in (workers or self.workers)}

    def run_on_scheduler(self, fn):
        assert fn is _pid_info
        return socket.gethostname(), self.scheduler, os.getpid()


def _check_counted_as_ours(monitor: LoadMonitor, proc: subprocess.Popen) -> None:
    _burn(proc)
    (load,) = monitor.stop()
    assert proc.pid not in [pid for pid, _, _ in load.top], load.describe()
    assert load.ours * load.seconds >= BURN - 0.05, load  # its CPU seconds are the cluster's


def _idle() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_scheduler_in_a_process_of_its_own_is_not_another_program():
    worker, scheduler = _idle(), None
    try:
        scheduler = _busy()  # `dask scheduler` beside the workers, busy while distlab measures
        monitor = LoadMonitor(_Client({"tcp://w:1": worker.pid}, scheduler.pid)).start()
        _check_counted_as_ours(monitor, scheduler)
    finally:
        for p in (worker, scheduler):
            if p is not None:
                p.kill()
                p.wait()


def test_a_worker_that_replaced_a_lost_one_while_distlab_measured_is_not_another_program():
    lost, scheduler, fresh = _idle(), _idle(), None
    try:
        client = _Client({"tcp://w:1": lost.pid}, scheduler.pid)
        monitor = LoadMonitor(client).start()
        lost.kill()
        lost.wait()
        fresh = _busy()  # its nanny (this process) starts a new worker process, which imports and joins
        client.workers = {"tcp://w:2": fresh.pid}
        _check_counted_as_ours(monitor, fresh)
    finally:
        for p in (scheduler, fresh):
            if p is not None:
                p.kill()
                p.wait()
