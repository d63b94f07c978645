"""The kernel's stop button (a KeyboardInterrupt in the thread that waits, as IPython raises on
SIGINT) during probe_staleness, calibrate and measure_model: each ends within 5 s, no worker is
restarted, and the Lab serves the next launch."""

from __future__ import annotations

import _thread
import os
import sys
import threading
import time
from collections.abc import Callable

import cloudpickle
import pytest
import torch
from launch_helpers import Blobs, TinyNet, allreduce_strategy

from distlab.cluster import spmd

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STOP_WITHIN = 5.0  # seconds from the interrupt to the call's return (issue 54, "Stop means stop")


def _on_a_worker() -> bool:
    try:
        from distributed import get_worker

        get_worker()
        return True
    except (ImportError, ValueError):
        return False


class SlowStep(torch.nn.Module):
    """A model whose forward takes ``seconds`` on a Dask worker (its checks and profile in the
    kernel are fast): a model whose step takes seconds, in many short Python-level pieces as a
    real model's operators are."""

    def __init__(self, seconds: float = 2.0) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)
        self.seconds = seconds

    def forward(self, x):
        if _on_a_worker():
            end = time.monotonic() + self.seconds
            while time.monotonic() < end:
                time.sleep(0.02)
        return self.fc(x)


def _interrupt_when(ready: Callable[[], bool], within: float = 120.0) -> tuple[Callable[[], None], dict]:
    """Start a thread that sends the kernel's interrupt (``_thread.interrupt_main``: SIGINT's
    handler in the main thread) once ``ready()``; returns ``finished`` (call it when the call
    under test returned: no interrupt is sent after it) and what it saw (``at``: when it sent)."""
    lock, seen = threading.Lock(), {"at": None, "finished": False}

    def watch() -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if ready():
                with lock:
                    if not seen["finished"]:
                        seen["at"] = time.monotonic()
                        _thread.interrupt_main()
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()

    def finished() -> None:
        with lock:
            seen["finished"] = True

    return finished, seen


def _ranks_busy(lab) -> Callable[[], bool]:
    """Ready once some rank has executed for a second (inside its steps, not at its start)."""
    since: list[float] = []

    def ready() -> bool:
        if not spmd.active_on_cluster(lab.client):
            since.clear()
            return False
        since.append(since[0] if since else time.monotonic())
        return time.monotonic() - since[0] > 1.0

    return ready


def _stopped_in_time(lab, call: Callable[[], object], ready: Callable[[], bool]) -> str:
    """Run ``call`` with the interrupt sent once ``ready()``: it raises KeyboardInterrupt within
    STOP_WITHIN s of it, no rank executes after it, no worker was restarted; returns its message."""
    pids = lab.client.run(os.getpid)
    finished, seen = _interrupt_when(ready)
    with pytest.raises(KeyboardInterrupt) as info:
        try:
            call()
        finally:
            finished()
    took = time.monotonic() - seen["at"]
    assert took < STOP_WITHIN, f"the call returned {took:.1f} s after the interrupt"
    assert spmd.active_on_cluster(lab.client) == {}, "ranks still executing after the call returned"
    assert lab.client.run(os.getpid) == pids, "a worker was restarted"
    return str(info.value)


def _trains_next(lab) -> None:
    tiny = TinyNet()
    run = lab.launch(
        tiny, strategy=allreduce_strategy(tiny, lab.resources), steps=3, data=Blobs(), elastic=False
    )
    assert run.wait(60).status == "finished"


def test_stop_during_probe_staleness_cancels_its_run_and_starts_no_other(clean_lab):
    """A stale run's ranks would agree on a stop its staleness plus two steps ahead: 6 steps of 2 s
    here (the 5 s grace then restarted both workers, and the cancel said "ranks did not stop
    within 10 s")."""
    x, y = torch.randn(256, 8), torch.randint(0, 4, (256,))
    before = len(clean_lab.history)
    started = lambda: len(clean_lab.history) > before and clean_lab.history[-1].steps_done >= 1  # noqa: E731
    said = _stopped_in_time(
        clean_lab,
        lambda: clean_lab.probe_staleness(SlowStep(), data=(x, y), staleness=[4], steps=40, batch_size=16),
        started,
    )
    assert "cancelled on every worker" in said and "\n" not in said, said
    probe_runs = clean_lab.history[before:]
    assert len(probe_runs) == 1, "the probe started another run after the interrupt"
    assert probe_runs[0].status == "cancelled"
    _trains_next(clean_lab)


def test_stop_during_measure_model_ends_its_ranks(clean_lab):
    x, y = torch.randn(256, 8), torch.randint(0, 4, (256,))
    said = _stopped_in_time(
        clean_lab,
        lambda: clean_lab.measure_model(SlowStep(1.0), data=(x, y), progress=False),
        _ranks_busy(clean_lab),
    )
    assert said.endswith("interrupted: cancelled on every worker"), said
    _trains_next(clean_lab)


def test_stop_during_calibrate_ends_its_ranks(clean_lab, tmp_path, monkeypatch):
    """Pressed in the collectives' stage (seconds of all-reduces and barriers on every rank)."""
    monkeypatch.setattr(clean_lab, "cache_dir", tmp_path)  # the user's cache neither read nor written
    said = _stopped_in_time(
        clean_lab, lambda: clean_lab.calibrate(cache=False, progress=False), _ranks_busy(clean_lab)
    )
    assert said == "calibrate interrupted: cancelled on every worker", said
    _trains_next(clean_lab)
