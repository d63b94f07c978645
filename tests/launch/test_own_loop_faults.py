"""``lab.run(train)``'s faults on a live 2-worker cluster (issue 56): bad input is one line naming it
and the fix, a raising rank names its line and step, cancel, and a killed worker's resume at the
exact step and sample. Nothing is left running."""

from __future__ import annotations

import math
import os
import re
import sys
import time

import cloudpickle
import pytest
import torch
import torch.nn.functional as F
from launch_helpers import Gate
from own_loop_helpers import EmbNet, loop, tokens
from torch.utils.data import (
    DataLoader,
    IterableDataset,
    SequentialSampler,
    WeightedRandomSampler,
)

from distlab.cluster import spmd
from distlab.errors import LaunchError
from tests.polling import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _ends_clean(lab) -> None:
    poll_for(lambda: spmd.active_on_cluster(lab.client) == {}, 10, "no rank left training")


# -- Bad input: one line naming what is wrong and the fix, nothing left running -----------------------


class Stream(IterableDataset):
    def __iter__(self):
        return iter(tokens(64))


def _refusal(lab, train, where: str = "rank", **options) -> str:
    """The one-line error for ``train``: from ``lab.run`` itself (``where="kernel"``: no run was
    started) or from its run's ``wait``; either way no rank is left running."""
    runs = len(lab.history)
    with pytest.raises(LaunchError) as info:
        run = lab.run(train, elastic=False, **options)
        assert where == "rank", "lab.run started a run it should have refused in the kernel"
        run.wait(60)
    if where == "kernel":
        assert len(lab.history) == runs
    _ends_clean(lab)
    msg = str(info.value)
    assert "\n" not in msg, msg
    return msg


def _prepared_twice(ctx, model, opt, loader):
    ctx.prepare(model, opt, loader)
    return ctx.prepare(model, opt, loader)


def _a_stray_parameter(ctx, model, opt, loader):
    stray = torch.nn.Parameter(torch.zeros(3))
    return ctx.prepare(model, torch.optim.SGD([*model.parameters(), stray], lr=0.1), loader)


def _report(**values):
    def body(ctx, m, opt, x, y):
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.report(**values)

    return body


def _step_first(ctx, m, opt, x, y):
    opt.step()


def _two_backward_passes(ctx, m, opt, x, y):
    out = m(x)
    opt.zero_grad()
    F.cross_entropy(out, y).backward(retain_graph=True)
    (out**2).mean().backward()  # its gradients would reach the ranks' average late, or never
    opt.step()


def _forward_outside_accumulate(ctx, m, opt, x, y):
    loss = F.cross_entropy(m(x), y)
    opt.zero_grad()
    with ctx.accumulate():  # DDP decided at the forward that this backward syncs
        loss.backward()
    F.cross_entropy(m(x), y).backward()
    opt.step()


@pytest.mark.parametrize(
    "mistake, where, match",
    [
        (dict(prepare=_prepared_twice), "rank", r"ctx\.prepare: called twice; prepare .* once"),
        (
            dict(prepare=_a_stray_parameter),
            "kernel",
            r"optimizer holds 1 parameter.*not the model's.*build it on model\.parameters\(\)",
        ),
        (dict(loader=DataLoader(Stream(), batch_size=8)), "kernel", r"dataset is iterable.*map-style"),
        (
            dict(loader=DataLoader(tokens(64), batch_size=8, sampler=WeightedRandomSampler([1.0] * 64, 64))),
            "kernel",
            r"own sampler \(WeightedRandomSampler\).*shuffle=True or False, no sampler=",
        ),
        (  # torch's own sampler class, but over part of the dataset: refused, not silently widened
            dict(loader=DataLoader(tokens(64), batch_size=8, sampler=SequentialSampler(range(32)))),
            "kernel",
            r"own sampler \(SequentialSampler\).*no sampler=.*Subset\(dataset, indices\)",
        ),
        (
            dict(body=_report(loss=torch.ones(3))),
            "rank",
            r"ctx\.report: loss= is a tensor of shape \(3,\); report a scalar",
        ),
        (dict(body=_report(acc=float("nan"))), "rank", r"ctx\.report: acc=nan is not finite"),
        (
            dict(body=_step_first),
            "rank",
            r"optimizer\.step\(\) at step 0: no variable has a gradient.*call loss\.backward\(\)",
        ),
        (
            dict(body=_two_backward_passes),
            "rank",
            r"loss\.backward\(\) ran twice in step 0 .*add the losses and call backward once",
        ),
        (
            dict(body=_forward_outside_accumulate),
            "rank",
            r"ctx\.accumulate\(\): in step 0 a backward inside the block followed a forward outside it; put",
        ),
    ],
    ids=[
        "prepare-twice",
        "stray-parameter",
        "iterable-dataset",
        "sampler",
        "subset-sampler",
        "tensor-report",
        "nan-report",
        "step-before-backward",
        "two-backward-passes",
        "forward-outside-accumulate",
    ],
)
def test_a_mistake_in_the_loop_is_one_line_naming_it_and_the_fix(clean_lab, mistake, where, match):
    msg = _refusal(clean_lab, loop(**mistake), where)
    assert re.search(match, msg), msg


def _raises_on_rank_one(ctx):
    torch.manual_seed(0)
    model = EmbNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    m, opt, loader = ctx.prepare(model, opt, DataLoader(tokens(64), batch_size=8, shuffle=True))
    for x, y in loader:
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        if ctx.rank == 1 and ctx.step == 2:
            raise ValueError("this batch is corrupt")
        opt.step()


def test_a_rank_that_raises_names_the_rank_the_step_and_the_line(clean_lab):
    import inspect

    lines, first = inspect.getsourcelines(_raises_on_rank_one)
    line = first + next(i for i, text in enumerate(lines) if "raise ValueError" in text)
    msg = _refusal(clean_lab, _raises_on_rank_one)
    assert "rank 1 " in msg and "step 2" in msg and "ValueError: this batch is corrupt" in msg, msg
    assert f"_raises_on_rank_one line {line}" in msg, msg


def _no_prepare(ctx):
    return 0


def _prepares_on_rank_zero_only(ctx):
    if ctx.rank == 0:
        torch.manual_seed(0)
        model = EmbNet()
        ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(tokens(64), batch_size=8))


def _two_arguments(ctx, extra):
    pass


@pytest.mark.parametrize(
    "train, where, match",
    [
        (_no_prepare, "kernel", r"returned without calling ctx\.prepare\(model, optimizer, loader\)"),
        (
            _prepares_on_rank_zero_only,
            "rank",
            r"without calling ctx\.prepare.* on rank 1; every rank prepares",
        ),
        (_two_arguments, "kernel", r"_two_arguments must take one argument.*def train\(ctx\)"),
        (lambda: None, "kernel", r"must take one argument, the TrainContext"),
        (EmbNet(), "kernel", r"train is a model \(EmbNet\); pass your function train\(ctx\).*lab\.launch"),
    ],
    ids=["no-prepare", "prepare-on-rank-0-only", "two-arguments", "no-argument", "a-module"],
)
def test_a_train_that_is_not_a_loop_of_ctx_is_one_line(clean_lab, train, where, match):
    msg = _refusal(clean_lab, train, where)
    assert re.search(match, msg), msg


# -- cancel --------------------------------------------------------------------------------------------


def test_cancel_stops_every_rank_of_a_loop_within_ten_seconds(clean_lab, tmp_path):
    gate = Gate(tmp_path)  # the reads stop after 3 steps until released: running when cancelled
    data = HeldIndexed(gate, free=3 * 16, n=192)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)

    def train(ctx):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        m, opt, loader = ctx.prepare(model, opt, DataLoader(data, batch_size=16, shuffle=True))
        for _ in ctx.epochs(10_000):
            for x, y, _index in loader:
                opt.zero_grad()
                F.cross_entropy(m(x), y).backward()
                opt.step()
        return "ran to its end"

    run = clean_lab.run(train, elastic=False)
    poll_for(lambda: len(run.metrics) >= 4 or run.done, 120, "4 step records")
    assert not run.done, run.error
    gate.release()
    t0 = time.monotonic()
    run.cancel()
    assert time.monotonic() - t0 < 10
    assert run.status == "cancelled"
    assert spmd.active_on_cluster(clean_lab.client) == {}
    assert run.metrics["step"].max() < 6 * 10_000


# -- Done when: a worker killed mid-run, the loop resumes on the survivor at the exact step --------------
# (last in the file: the killed worker comes back cold, and the next run pays its warm-up)


class HeldIndexed(torch.utils.data.Dataset):
    """``(x, y, index)`` samples whose reads stop after ``free`` in each process until the test
    releases ``gate``: the run is where the test wants it when a worker is killed."""

    def __init__(self, gate: Gate, free: int, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.x = torch.randn(4, 8, generator=g)[self.y] * 3 + torch.randn(n, 8, generator=g)
        self.gate, self.free, self._reads = str(gate.path), free, 0

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_reads": 0}  # the kernel's reads (planning, profile) do not count

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        self._reads += 1
        deadline = time.monotonic() + 120
        while self._reads > self.free and not os.path.exists(self.gate):
            if time.monotonic() > deadline:
                raise RuntimeError(f"HeldIndexed: the test never released {self.gate} in 120 s")
            time.sleep(0.005)
        return self.x[i], self.y[i], i


class Seen:
    """How often the loop saw each sample, per epoch: the ``ctx.state`` object the resume restores."""

    def __init__(self, epochs: int, n: int) -> None:
        self.counts = torch.zeros(epochs, n)

    def state_dict(self) -> dict:
        return {"counts": self.counts.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.counts = state["counts"].clone()


@pytest.mark.parametrize("strategy", ["AllReduce", "PS"])  # PS: the servers take the restored lr too
def test_a_killed_worker_resumes_the_loop_on_the_survivor_at_the_exact_step(clean_lab, tmp_path, strategy):
    n, batch, epochs, every, t_max = 192, 16, 3, 4, 50
    # 2 ranks: 6 steps an epoch; the reads stop at step 11 until the kill, past the checkpoint at 8
    gate = Gate(tmp_path)
    data = HeldIndexed(gate, free=11 * batch, n=n)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def train(ctx):
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max)
        seen = ctx.state("seen", Seen(epochs, n))
        m, opt, loader = ctx.prepare(model, opt, DataLoader(data, batch_size=batch, shuffle=True), sched)
        for epoch in ctx.epochs(epochs):
            for x, y, index in loader:
                loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                lr = opt.param_groups[0]["lr"]
                opt.step()
                sched.step()
                mark = torch.zeros(n).index_add_(0, index, torch.ones(len(index)))
                seen.counts[epoch] += ctx.all_reduce(mark, "sum")  # every rank's samples of the step
                ctx.report(loss=loss, lr=lr, epoch=epoch)
        return seen.counts

    victim = clean_lab.resources.addresses[1]
    pid = clean_lab.client.run(os.getpid, workers=[victim])[victim]
    run = clean_lab.run(train, strategy=strategy, checkpoint_every=every)  # elastic by default

    def at_step_ten() -> bool:
        assert run.status in ("pending", "running"), run.error
        return (run.metrics["step"] >= 10).sum() >= 2 if len(run.metrics) else False

    poll_for(at_step_ten, 120, "step 10 on both ranks")
    os.kill(pid, 9)
    gate.release()
    run.wait(120)
    assert run.status == "finished", run.error
    assert run.restarts == 1 and run.world == 1
    # each sample once in each epoch: the data position, and the registered counts, were restored
    assert run.result.shape == (epochs, n) and bool((run.result == 1).all()), run.result.sum(1)
    df = run.metrics
    before, after = df[df.restart == 0], df[df.restart == 1].sort_values("step")
    first = int(after["step"].iloc[0])
    assert first == 8  # the newest checkpoint, in epoch 1, 2 steps before the kill
    # 8 steps of 32 samples, then 1 rank reads 16 a step: 128 of epoch 1 and 192 of epoch 2 left
    assert list(after["step"]) == list(range(8, 8 + 8 + 12))
    assert list(after["epoch"]) == [1] * 8 + [2] * 12
    # the scheduler was restored: every step's lr is the cosine's at that step, not restarted at 0
    cosine = [0.05 * (1 + math.cos(math.pi * s / t_max)) / 2 for s in after["step"]]
    assert after["lr"].tolist() == pytest.approx(cosine, rel=1e-5)
    # rank 0's step 8 again: the same weights on the same 16 samples give the same loss
    again = before[(before["rank"] == 0) & (before["step"] == first)]["loss"].iloc[0]
    assert after["loss"].iloc[0] == pytest.approx(again, abs=1e-6)
