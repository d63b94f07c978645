"""A run paused under one strategy resumes under another (AllReduce -> PS, PS -> AllReduce) at the exact
step, with the parameters an uninterrupted run reaches: the checkpoint's optimizer state is one
full-shape state per variable (runtime/optim_state.py), whatever strategy wrote or reads it."""

from __future__ import annotations

import copy
import sys

import cloudpickle
import pytest
import torch
from launch_helpers import Blobs, TinyNet

import distlab as dl
from tests.polling import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 400  # Adam, 10 per replica, 2 workers: 8 epochs of 100 samples
# an uninterrupted AllReduce run and an uninterrupted PS run end this close (float sums in
# another order); a resume that lost the optimizer state or the data position lands far outside
CLOSE = 1e-5


def _launch(lab, model, strategy):
    return lab.launch(copy.deepcopy(model), strategy=strategy, steps=STEPS, data=Blobs(n=100), batch_size=10)


def _params(run) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in run.model.state_dict().items()}


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def start() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet()


@pytest.fixture(scope="module")
def uninterrupted(lab, start) -> dict[str, dict[str, torch.Tensor]]:
    """Each strategy's run from the same start, never paused."""
    out = {}
    for name in ("AllReduce", "PS"):
        run = _launch(lab, start, name)
        run.wait(timeout=120, progress=False)
        out[name] = _params(run)
    return out


def test_allreduce_and_ps_runs_uninterrupted_end_alike(uninterrupted):
    # what makes the comparisons below meaningful: the two strategies take the same steps
    assert _gap(uninterrupted["AllReduce"], uninterrupted["PS"]) < CLOSE


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("first", "then"), [("AllReduce", "PS"), ("PS", "AllReduce")])
def test_a_run_paused_under_one_strategy_resumes_under_another_at_the_exact_step(
    lab, start, uninterrupted, first, then
):
    profile = dl.profile(copy.deepcopy(start), batch_size=10)
    run = _launch(lab, start, first)
    poll_for(lambda: run.steps_done >= 5, 60, "5 steps before the pause")
    assert run.pause(30), "the run ended before it could be paused"
    workers = list(lab.workers)
    run.resume_on(
        workers, lambda ws: dl.strategy.build(then, profile, lab.resources.of_workers(ws), batch_size=10)
    )
    run.wait(timeout=120, progress=False)
    assert run.strategy.builder == then and run.restarts == 1
    r0 = run.metrics[run.metrics["rank"] == 0].sort_values("step")
    assert list(r0["step"]) == list(range(STEPS))  # resumed at the step it paused at: none re-run
    assert 0 < (r0["restart"] == 0).sum() < STEPS  # some steps under each strategy
    # each step moved the data position by its global batch from 0: every sample once per epoch
    assert (r0["samples"].to_numpy() == (r0["world"].to_numpy() * 10).cumsum()).all()
    gap = _gap(_params(run), uninterrupted[first])
    assert gap < CLOSE, f"{first} -> {then}: {gap:.2e} from the uninterrupted run"
