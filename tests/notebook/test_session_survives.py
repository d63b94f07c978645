"""A notebook session that survives real use: the kernel's stop button, a lost worker, a magic that
fails, and the Lab reachable from the notebook. The kernel is a real one (jupyter_client), signalled
as JupyterLab's stop button signals it."""

from __future__ import annotations

import ast
import contextlib
import os
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.nn as nn

from tests.notebook.conftest import run

ROOT = Path(__file__).resolve().parents[2]


class Kernel:
    """A python3 kernel started as JupyterLab starts it (its own process group, which the stop
    button signals as a whole); ``cell(code)`` returns (stdout, stderr, error)."""

    def __init__(self) -> None:
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        self.timers: list[threading.Timer] = []  # stop-button presses still to come
        self.closed = False

    def press_stop(self, after: float) -> None:
        """Presses the stop button ``after`` seconds from now, unless the kernel is closed first
        (a press after the shutdown raised in the timer's thread, under a later test's name)."""
        timer = threading.Timer(after, self.km.interrupt_kernel)
        self.timers.append(timer)
        timer.start()

    def cell(
        self, code: str, timeout: float = 180, interrupt_after: str | None = None
    ) -> tuple[str, str, str]:
        """Runs ``code``; with ``interrupt_after``, presses the stop button a second after the cell
        shows that text (a fixed delay from the start can land before a launch's run exists)."""
        msg_id = self.kc.execute(code)
        out, err, error = [], [], ""
        while True:
            msg = self.kc.get_iopub_msg(timeout=timeout)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                (out if content["name"] == "stdout" else err).append(content["text"])
            elif kind in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", ""))
            elif kind == "error":
                error = f"{content['ename']}: {content['evalue']}"
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out), "".join(err), error
            if interrupt_after is not None and interrupt_after in "".join(out):
                self.press_stop(1.0)
                interrupt_after = None

    def pids(self) -> list[int]:
        out, _, error = self.cell("print(sorted(lab.client.run(__import__('os').getpid).values()))")
        assert not error, error
        return ast.literal_eval(out.strip().splitlines()[-1])

    def process(self):
        import psutil

        out, _, error = self.cell("print(__import__('os').getpid())")
        assert not error, error
        return psutil.Process(int(out.strip()))

    @staticmethod
    def _workers(kernel) -> int:
        """The kernel's worker processes: those its forkserver started (forks of the server, whose
        command line they keep; runtime/spawn.py ``process_context``), or spawned ones."""

        def started(p) -> bool:
            line = " ".join(p.cmdline())
            return "spawn_main" in line or ("forkserver" in line and p.ppid() != kernel.pid)

        count = 0
        for p in kernel.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                count += p.is_running() and started(p)
        return count

    def spawned(self, settle: int | None = None, within: float = 30.0) -> int:
        """How many worker processes the kernel has spawned that still run; with ``settle``, waits
        up to ``within`` seconds for that many (closed workers take a moment to exit)."""
        kernel = self.process()
        deadline = time.time() + within
        while True:
            n = self._workers(kernel)
            if settle is None or n == settle or time.time() > deadline:
                return n
            time.sleep(0.5)

    def interrupt_once_spawning(self, beyond: int, within: float = 60.0) -> None:
        """Presses the stop button as soon as the kernel has more than ``beyond`` worker processes:
        a cluster is then starting (a spawned worker takes seconds to import and register), on a
        fast machine as on a slow one, where a fixed delay can land after the start finished."""
        kernel = self.process()

        def watch() -> None:
            deadline = time.time() + within
            while time.time() < deadline and not self.closed:
                if self._workers(kernel) > beyond:
                    self.km.interrupt_kernel()
                    return
                time.sleep(0.02)

        threading.Thread(target=watch, daemon=True).start()

    def reconnect(self) -> None:
        """As a browser tab closed and opened again: this connection ends, a new one starts."""
        self.kc.stop_channels()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def close(self) -> None:
        self.closed = True
        for timer in self.timers:
            timer.cancel()
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_stop_button_leaves_the_workers_and_a_lost_worker_is_one_line():
    kernel = Kernel()
    try:
        out, err, error = kernel.cell("import distlab\n%distlab cluster local 2")
        assert not error and "the cluster's Lab is in `lab`" in out, (out, err, error)
        before = kernel.pids()
        assert len(before) == 2
        for _ in range(3):  # JupyterLab's stop button on an idle kernel, three times
            kernel.km.interrupt_kernel()
            time.sleep(1.0)
        time.sleep(2.0)
        assert kernel.pids() == before  # the same worker processes, still serving
        out, err, error = kernel.cell("%distlab cluster status")
        assert not error and "<Lab 2 workers" in out and err == "", (out, err)

        # the stop button during a launch still stops the run, on every worker, and only the run
        kernel.cell(
            "import torch\nX = torch.randn(512, 8); train = (X, (X[:, 0] > 0).long())\n"
            "net = torch.nn.Linear(8, 2)"
        )
        # pressed a second after the run's card is shown, while the cell waits for the run: the run itself
        # must be cancelled, not a launch interrupted while it prepared (which cancels nothing and said
        # "interrupted"; the old fixed 8 s landed there on a loaded machine). Pressed between the launch's
        # print and its card, while the live view is set up, the interrupt can be swallowed ("Exception
        # ignored in: WeakSet._remove") and the run trains on: a defect of the magic, not this test's.
        _, err, error = kernel.cell(
            "%distlab launch net --data train --strategy AllReduce --steps 1000000",
            interrupt_after="<Run ",
        )
        assert not error and "cancelled: Ctrl-C stopped it on every worker" in err, err
        out, _, error = kernel.cell("print(run.status, run.steps_done < run.steps)")
        assert not error and out.split() == ["cancelled", "True"], (out, error)
        assert kernel.pids() == before

        # the browser tab closed during a run and opened again: a new connection to the same kernel
        # finds the Lab, the run (finished meanwhile) and the remembered inputs
        kernel.kc.execute("%distlab launch net --data train --strategy AllReduce --steps 3000 -o closed")
        time.sleep(3.0)
        kernel.reconnect()
        out, _, error = kernel.cell("closed.wait(timeout=120)\nprint(repr(closed))")
        assert not error and "finished: AllReduce on 2 ranks, 3000/3000 steps" in out, (out, error)
        out, err, error = kernel.cell("%distlab launch net --strategy AllReduce --steps 20 -o again")
        assert not error and "Traceback" not in err and kernel.pids() == before, (out, err, error)
        out, _, _ = kernel.cell("print(again.status, again.data_info)")
        assert out.startswith("finished") and "512 samples" in out, out

        # a worker that is gone (its nanny gave up on it, or it was retired) is one line, then comes
        # back (a killed worker process comes back through its nanny by itself)
        out, _, error = kernel.cell(
            "lab.client.retire_workers([sorted(lab.client.scheduler_info()['workers'])[0]])\n"
            "print(repr(lab))"  # a Lab's repr never raises
        )
        assert not error and "1 of 2 workers running (1 lost: lab.heal() or the next launch" in out, out
        out, err, error = kernel.cell("%distlab cluster status")
        assert not error and "Traceback" not in out + err, (out, err, error)
        assert out.startswith("distlab: 1 worker(s) of the cluster were lost; restarting them\n"), out
        assert "<Lab 2 workers" in out and len(kernel.pids()) == 2

        # the stop button while a cluster starts: the new one is closed, whole, and the Lab kept
        spawned, now = kernel.spawned(), kernel.pids()
        kernel.interrupt_once_spawning(beyond=spawned)
        out, err, error = kernel.cell("%distlab cluster local 1 -o other")
        assert not error and err == "distlab: %distlab cluster interrupted; the session is as it was\n", (
            out,
            err,
        )
        assert kernel.pids() == now and kernel.spawned(settle=spawned) == spawned
        out, _, _ = kernel.cell("print('other' in dir())")
        assert out.strip() == "False"

        # changing clusters and stopping: no Dask log lines in the cells; the old Lab says it closed
        for line in ("%distlab cluster local 1 -o small", "%distlab cluster stop"):
            out, err, error = kernel.cell(line)
            assert not error and err == "", (line, out, err)
        out, _, _ = kernel.cell("print(repr(small), repr(lab))")
        assert out.count("<Lab (closed), ") == 2 and "lab = dl.Lab() starts a new one" in out, out

        # the stop button while a cluster stops: it stops all the same, no worker left behind
        kernel.cell("%distlab cluster local 1")
        kernel.press_stop(0.3)
        out, err, error = kernel.cell("%distlab cluster stop")
        assert not error and "Traceback" not in out + err and "cluster stopped" in out, (out, err, error)
        assert kernel.spawned(settle=0) == 0

        # distlab's warnings are one distlab: line in the notebook
        _, err, _ = kernel.cell(
            "import warnings\nfrom distlab.errors import DistlabWarning\n"
            "warnings.warn('lab: runs drift', DistlabWarning)"
        )
        assert err == "distlab: lab: runs drift\n", err
    finally:
        kernel.close()


def test_a_magic_that_fails_leaves_the_remembered_inputs_and_names_them(shell, capsys):
    shell.user_ns["net"] = nn.Linear(4, 3)
    shell.user_ns["train"] = (torch.randn(64, 4), torch.randint(0, 3, (64,)))
    shell.user_ns["bad3"] = (torch.randn(64, 7), torch.randint(0, 3, (64,)))
    out, err = run(shell, "profile net --data train", capsys)
    assert err == "", err
    _, err = run(shell, "profile net --data bad3", capsys)
    assert err.startswith("distlab: data:") and "does not fit model" in err
    out, err = run(shell, "profile net", capsys)  # the data that worked is still remembered
    assert err == "" and "ModelProfile" in out, err
    # the model changed under the remembered data: the error says where the data came from
    shell.user_ns["net"] = nn.Linear(5, 3)
    _, err = run(shell, "profile net", capsys)
    assert "the data is `train`, remembered for net from an earlier line; give --data VAR" in err, err
    assert err.count("\n") == 1
