"""lab.adapt(minimum, maximum): a shared Lab grows for a run that waits and shrinks once a worker idles,
pausing the run on the worker it retires at a step with a checkpoint first."""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from distlab.errors import SchedulerError
from distlab.lab import Lab
from tests.polling import poll_for
from tests.sched.test_lab_shared import Blobs, Net

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.mark.timeout(240)
def test_adapt_grows_for_a_waiting_run_then_retires_its_worker_only_after_checkpointing_it(tmp_path):
    with Lab(1, timeout=60, cache_dir=tmp_path, scheduler="fifo", interval=0.5) as lab:
        with pytest.raises(SchedulerError, match="minimum=3 is above maximum=2"):
            lab.adapt(3, 2)
        lab.adapt(1, 2)
        a = lab.launch(Net(), steps=100_000, data=Blobs(), batch_size=10, workers=1)
        b = lab.launch(Net(), steps=100_000, data=Blobs(n=100, seed=1), batch_size=10, workers=1)
        # b waits for a worker; the cluster grows by one for it and it starts there
        poll_for(lambda: b.steps_done > 20, 90, "the waiting run to start on a new worker")
        assert len(lab.workers) == 2 and a.status == "running"
        a.cancel()
        # a's worker idles; the scale-down retires the newest worker, b's: b pauses at a step with a
        # checkpoint first, then resumes on the worker that stays
        shrunk = lambda: len(lab.workers) == 1 and b.restarts == 1 and b.status == "running"  # noqa: E731
        poll_for(shrunk, 90, "the shrink, b resumed on the worker that stays")
        at = b.steps_done
        poll_for(lambda: b.steps_done > at + 10, 60, "b to train on after the shrink")
        b.cancel()
        r0 = b.metrics[b.metrics["rank"] == 0].sort_values("step")
        assert list(r0["step"]) == list(range(len(r0)))  # resumed at the step it paused at
        assert (r0["samples"].to_numpy() == (r0["world"].to_numpy() * 10).cumsum()).all()
        assert [s["to"] for s in lab.scheduler.sizes] == [2, 1]
