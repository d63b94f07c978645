"""``lab.run(train)``: a user's own loop under distlab's strategies on a live 2-worker cluster (issue 56):
the same parameters as ``lab.launch``, a real loop's accuracy, bad input, reports, an elastic resume."""

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
from torch.utils.data import (
    DataLoader,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)

from distlab.cluster import spmd
from distlab.errors import LaunchError
from distlab.runs.validate import variables_profile
from distlab.strategy import build
from tests.polling import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


class EmbNet(torch.nn.Module):
    """An embedding and two layers: PS and Parallax place its variables differently (the embedding
    sparse-style on a server, the dense layers all-reduced)."""

    def __init__(self, vocab: int = 40) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, 8)
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.emb(x).mean(1))))


def _tokens(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randint(0, 40, (n, 5), generator=g), torch.randint(0, 4, (n,), generator=g))


def _sgd_loop(model, data, steps: int, batch: int, lr: float, momentum: float = 0.0):
    """A plain user loop: SGD, a shuffled DataLoader, ``steps`` optimizer steps."""

    def train(ctx):
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        loader = DataLoader(data, batch_size=batch, shuffle=True)
        m, opt, loader = ctx.prepare(model, opt, loader)
        while ctx.step < steps:
            for x, y in loader:
                loss = F.cross_entropy(m(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if ctx.step >= steps:
                    break
        return ctx.step

    return train


def _max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)


def _ends_clean(lab) -> None:
    poll_for(lambda: spmd.active_on_cluster(lab.client) == {}, 10, "no rank left training")


# -- Done when: the same parameters as lab.launch -------------------------------------------------------


@pytest.mark.parametrize(
    "strategy, steps",
    [
        ("AllReduce", 12),  # 12 steps of 2 x 16 cross the first epoch's end (256 samples)
        ("PS", 12),
        ("PSLoadBalancing", 12),
        ("Parallax", 12),
        ("Gossip", 12),
        # AdaScale's gains; within the first epoch: lab.launch's controller may change the batch at
        # an epoch's end, from timings
        ("AdaptiveBatch", 8),
    ],
)
def test_a_plain_sgd_loop_ends_at_the_parameters_lab_launch_ends_at(clean_lab, strategy, steps):
    batch, lr, momentum = 16, 0.1, 0.9
    data = _tokens()
    torch.manual_seed(0)
    model = EmbNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ref = clean_lab.launch(
        model,
        strategy=strategy,
        steps=steps,
        data=data,
        optimizer=lambda p: torch.optim.SGD(p, lr=lr, momentum=momentum),
        batch_size=batch,
        seed=3,
        elastic=False,
    )
    ref.wait(120)
    run = clean_lab.run(
        _sgd_loop(model, data, steps, batch, lr, momentum), strategy=strategy, seed=3, elastic=False
    )
    run.wait(120)
    assert run.status == "finished" and run.result == steps
    assert run.strategy.builder == ref.strategy.builder
    # both trained (a comparison of two untouched models would pass whatever the loop did)
    moved = max(float((ref.model.state_dict()[k] - v).abs().max()) for k, v in before.items())
    assert moved > 0.01
    assert _max_difference(ref.model, run.model) <= 1e-5


# -- Done when: a real loop (AdamW, cosine, clipping) trains a digits classifier ------------------------


@pytest.mark.parametrize("strategy", ["AllReduce", "stale PS"])  # stale PS: every rank builds an AdamW
def test_adamw_with_a_cosine_schedule_and_clipping_learns_digits_to_ninety_percent(clean_lab, strategy):
    from sklearn.datasets import load_digits

    steps = 200
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))  # a random held-out fifth
    held, kept = order[: len(y) // 5], order[len(y) // 5 :]
    data = TensorDataset(x[kept], y[kept])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))

    def train(ctx):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        loader = DataLoader(data, batch_size=32, shuffle=True)
        m, opt, loader = ctx.prepare(model, opt, loader, scheduler=sched)
        while ctx.step < steps:
            for xb, yb in loader:
                loss = F.cross_entropy(m(xb), yb)
                opt.zero_grad()
                loss.backward()
                norm = opt.clip_grad_norm_(1.0)
                lr = sched.get_last_lr()[0]
                opt.step()
                sched.step()
                ctx.report(loss=loss.item(), lr=lr, grad_norm=norm)
                if ctx.step >= steps:
                    break

    if strategy == "stale PS":  # a rank reads values at most one step old
        strategy = build("PS", variables_profile(model), clean_lab.resources, staleness=1, batch_size=32)
    run = clean_lab.run(train, strategy=strategy)
    run.wait(180)
    assert run.status == "finished", run.error
    with torch.no_grad():
        accuracy = float((run.model(x[held]).argmax(1) == y[held]).float().mean())
    assert accuracy >= 0.90, f"held-out accuracy {accuracy:.3f}"
    m = run.metrics[run.metrics["rank"] == 0].sort_values("step")
    assert list(m["step"]) == list(range(steps))
    # the cosine acted: each step's lr is the schedule's, falling from 1e-2 to about 0
    cosine = [1e-2 * (1 + math.cos(math.pi * s / steps)) / 2 for s in range(steps)]
    assert m["lr"].tolist() == pytest.approx(cosine, rel=1e-4, abs=1e-9)
    assert m["lr"].iloc[-1] < 1e-6 and m["loss"].iloc[-20:].mean() < m["loss"].iloc[:20].mean() / 4


@pytest.mark.parametrize("strategy", ["AllReduce", "PS", "Parallax"])
def test_clipping_clips_the_gradient_the_ranks_average_not_each_ranks_own(clean_lab, strategy):
    """One SGD step at lr 1 with the gradient clipped to a norm of 1e-3 moves the parameters by
    exactly 1e-3: clipping each rank's own gradient before the average would move them by less
    (the ranks' gradients point different ways), clipping nothing by far more."""
    max_norm = 1e-3
    data = _tokens()
    torch.manual_seed(0)
    model = EmbNet()

    def train(ctx):
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        m, opt, loader = ctx.prepare(model, opt, DataLoader(data, batch_size=16, shuffle=True))
        x, y = next(iter(loader))
        F.cross_entropy(m(x), y).backward()
        norm = opt.clip_grad_norm_(max_norm)
        opt.step()
        return float(norm)

    run = clean_lab.run(train, strategy=strategy, elastic=False)
    run.wait(60)
    assert run.status == "finished", run.error
    before, after = model.state_dict(), run.model.state_dict()
    moved = math.sqrt(sum(float(((after[k] - before[k]) ** 2).sum()) for k in before))
    assert run.result > 100 * max_norm  # the averaged gradient's norm, before clipping
    assert moved == pytest.approx(max_norm, rel=1e-3)


# -- Bad input: one line naming what is wrong and the fix, nothing left running -----------------------


class Stream(IterableDataset):
    def __iter__(self):
        return iter(_tokens(64))


def _loop(prepare=None, body=None, steps: int = 3, loader=None):
    """A loop over ``EmbNet`` whose ``prepare(ctx, model, opt, loader)`` and ``body(ctx, m, opt, x, y)``
    a test replaces to put one mistake in it."""
    torch.manual_seed(0)
    model, data = EmbNet(), _tokens(64)

    def plain_body(ctx, m, opt, x, y):
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ctx.report(loss=loss)

    def train(ctx):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ld = loader if loader is not None else DataLoader(data, batch_size=8, shuffle=True)
        m, opt, ld = (prepare or (lambda c, *a: c.prepare(*a)))(ctx, model, opt, ld)
        while ctx.step < steps:
            for x, y in ld:
                (body or plain_body)(ctx, m, opt, x, y)
                if ctx.step >= steps:
                    break
        return ctx.step

    return train


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
            dict(loader=DataLoader(_tokens(64), batch_size=8, sampler=WeightedRandomSampler([1.0] * 64, 64))),
            "kernel",
            r"own sampler \(WeightedRandomSampler\).*shuffle=True or False, no sampler=",
        ),
        (  # torch's own sampler class, but over part of the dataset: refused, not silently widened
            dict(loader=DataLoader(_tokens(64), batch_size=8, sampler=SequentialSampler(range(32)))),
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
    msg = _refusal(clean_lab, _loop(**mistake), where)
    assert re.search(match, msg), msg


def _raises_on_rank_one(ctx, m, opt, x, y):
    loss = F.cross_entropy(m(x), y)
    opt.zero_grad()
    loss.backward()
    if ctx.rank == 1 and ctx.step == 2:
        raise ValueError("this batch is corrupt")
    opt.step()


def test_a_rank_that_raises_names_the_rank_the_step_and_the_line(clean_lab):
    import inspect

    lines, first = inspect.getsourcelines(_raises_on_rank_one)
    line = first + next(i for i, text in enumerate(lines) if "raise ValueError" in text)
    msg = _refusal(clean_lab, _loop(body=_raises_on_rank_one, steps=6))
    assert "rank 1 " in msg and "step 2" in msg and "ValueError: this batch is corrupt" in msg, msg
    assert f"_raises_on_rank_one line {line}" in msg, msg


def _no_prepare(ctx):
    return 0


def _prepares_on_rank_zero_only(ctx):
    if ctx.rank == 0:
        torch.manual_seed(0)
        model = EmbNet()
        ctx.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(_tokens(64), batch_size=8))


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


# -- ctx.report ----------------------------------------------------------------------------------------


def _uneven_reports(ctx, m, opt, x, y):
    loss = F.cross_entropy(m(x), y)
    opt.zero_grad()
    loss.backward()
    step = ctx.step
    opt.step()
    if ctx.rank == 0:
        ctx.report(loss=loss)
    elif step % 2 == 1:  # rank 1 reports on odd steps only, many times (the last value is the step's)
        for i in range(50):
            ctx.report(seen=step * 100 + i)


def test_ranks_report_uneven_numbers_of_values_and_they_become_metrics_columns(clean_lab):
    steps = 6
    run = clean_lab.run(_loop(body=_uneven_reports, steps=steps), elastic=False)
    run.wait(60)  # would time out if a report waited for the other rank
    assert run.status == "finished", run.error
    df = run.metrics
    r0, r1 = (df[df["rank"] == r].sort_values("step") for r in (0, 1))
    assert list(r0["step"]) == list(range(steps)) == list(r1["step"])
    assert r0["loss"].notna().all() and r0["loss"].between(0.1, 5).all()
    assert r1["loss"].isna().all() and r0["seen"].isna().all()
    assert r1["seen"].tolist()[1::2] == [s * 100 + 49 for s in range(1, steps, 2)]
    assert r1["seen"].iloc[0::2].isna().all()


# -- ctx.accumulate --------------------------------------------------------------------------------------


def _accumulating_loop(model, data, steps: int, batch: int, k: int):
    """SGD over micro-batches of ``batch``: k forward and backward passes of loss / k, the first
    k - 1 inside ``ctx.accumulate()``, then one step."""

    def train(ctx):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        m, opt, loader = ctx.prepare(model, opt, DataLoader(data, batch_size=batch, shuffle=True))
        for i, (x, y) in enumerate(loader, 1):
            if i % k:
                with ctx.accumulate():
                    (F.cross_entropy(m(x), y) / k).backward()
                continue
            (F.cross_entropy(m(x), y) / k).backward()
            opt.step()
            opt.zero_grad()
            if ctx.step >= steps:
                break
        return ctx.step

    return train


@pytest.mark.parametrize("strategy", ["AllReduce", "PS"])
def test_k_accumulated_micro_steps_end_where_steps_of_k_times_the_batch_end(clean_lab, strategy):
    steps, batch, k = 4, 8, 3
    data = _tokens()  # 256 samples: 4 steps of 2 ranks x 24 stay in the first epoch's order
    torch.manual_seed(0)
    model = EmbNet()
    big = clean_lab.run(_sgd_loop(model, data, steps, k * batch, 0.1), strategy=strategy, elastic=False)
    big.wait(60)
    micro = clean_lab.run(_accumulating_loop(model, data, steps, batch, k), strategy=strategy, elastic=False)
    micro.wait(60)
    assert big.status == micro.status == "finished" and big.result == micro.result == steps
    assert _max_difference(big.model, model) > 0.01  # both trained
    assert _max_difference(big.model, micro.model) <= 1e-5


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
