"""``lab.run(train)``: a user's own loop under distlab's strategies on a live 2-worker cluster (issue 56):
the same parameters as ``lab.launch``, a real loop's accuracy, clipping, reports, accumulation. Its
faults and bad input: test_own_loop_faults.py."""

from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
import torch.nn.functional as F
from own_loop_helpers import EmbNet, loop, tokens
from torch.utils.data import DataLoader, TensorDataset

from distlab.runs.validate import variables_profile
from distlab.strategy import build

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


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
    data = tokens()
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
    data = tokens()
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
    run = clean_lab.run(loop(body=_uneven_reports, steps=steps), elastic=False)
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
    data = tokens()  # 256 samples: 4 steps of 2 ranks x 24 stay in the first epoch's order
    torch.manual_seed(0)
    model = EmbNet()
    big = clean_lab.run(_sgd_loop(model, data, steps, k * batch, 0.1), strategy=strategy, elastic=False)
    big.wait(60)
    micro = clean_lab.run(_accumulating_loop(model, data, steps, batch, k), strategy=strategy, elastic=False)
    micro.wait(60)
    assert big.status == micro.status == "finished" and big.result == micro.result == steps
    assert _max_difference(big.model, model) > 0.01  # both trained
    assert _max_difference(big.model, micro.model) <= 1e-5


class _HalfUsed(torch.nn.Module):
    """A model whose forward leaves one layer without a gradient (torch's DDP reducer fails on it
    at the second step: "Expected to have finished reduction in the prior iteration")."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = torch.nn.Linear(8, 2), torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.used(x)


def test_a_model_with_a_variable_its_step_leaves_without_gradient_trains_under_allreduce(lab):
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    data = TensorDataset(x, (x[:, 0] > 0).long())
    model = _HalfUsed()
    before = model.unused.weight.detach().clone()
    run = lab.run(_sgd_loop(model, data, steps=12, batch=16, lr=0.5), strategy="AllReduce")
    assert run.wait(120).status == "finished" and run.result == 12
    assert not run._job.options.ddp  # the profile saw the variable: distlab's buckets, not DDP's
    trained = run.model
    assert torch.equal(trained.unused.weight, before)  # no gradient, no update
    assert not torch.allclose(trained.used.weight, model.used.weight)


def test_lab_run_takes_launchs_straggler_and_metrics_options_and_names_an_unknown_one(clean_lab):
    """``lab.run(train, slowdown=, metrics=)`` as ``lab.launch`` takes them: the slowed rank waits
    before each backward (``delay``), the metric is a column of every step; any other name is one
    line listing the ones it takes, before anything runs."""
    from distlab.errors import LaunchError

    run = clean_lab.run(loop(steps=4), strategy="AllReduce", slowdown={1: 2.0}, metrics=["accuracy"])
    m = run.wait(120).metrics
    assert run.status == "finished" and "accuracy" in m and m["accuracy"].between(0, 1).all()
    delay = m.groupby("rank")["delay"].sum()
    assert delay[1] > 0 and delay[0] == 0, delay
    before = len(clean_lab.history)
    with pytest.raises(LaunchError, match=r"lab.run: unknown option 'slowdwon'; it takes slowdown, jitter"):
        clean_lab.run(loop(), slowdwon={1: 2.0})
    assert len(clean_lab.history) == before
