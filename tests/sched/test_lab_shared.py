"""Runs sharing one Lab: concurrent runs on workers of their own, a queue, refused allocations, a
failing neighbour and a re-allocation that resumes at the exact step (one 2-worker Lab for all)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

import cloudpickle
import pytest
import torch

from distlab.errors import LaunchError, SchedulerError
from distlab.lab import Lab
from distlab.sched import FifoPolicy
from tests.polling import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests


class Net(torch.nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, hidden), torch.nn.Linear(hidden, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Blobs(torch.utils.data.Dataset):
    """Class k is a Gaussian blob around centre k: a loss that falls within a few dozen steps."""

    def __init__(self, n: int = 200, seed: int = 0, fail_after: int | None = None) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.x = (torch.randn(4, 8, generator=g) * 3)[self.y] + torch.randn(n, 8, generator=g)
        self.fail_after, self.reads = fail_after, 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        self.reads += 1
        if self.fail_after is not None and self.reads > self.fail_after:
            raise ValueError("a broken sample")
        return self.x[i], self.y[i]


class Scripted:
    """A policy the test steers: ``plan(run_id -> k)`` gives each named run its first k free workers."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def allocate(self, jobs, workers: Mapping[str, str] | Sequence[str], previous):
        free, out = sorted(workers), {}
        for job in jobs:
            k = self.counts.get(job.name, 0)
            mine = [w for w in previous.get(job.name, ()) if w in free][:k]
            mine += [w for w in free if w not in mine][: k - len(mine)]
            free = [w for w in free if w not in mine]
            if mine:
                out[job.name] = mine
        return out


class OverCapacity:
    """Every job keeps its workers plus one the cluster does not have."""

    def allocate(self, jobs, workers, previous):
        return {job.name: [*previous.get(job.name, ()), "tcp://10.9.9.9:1"][-1:] for job in jobs}


class UnknownRun:
    def allocate(self, jobs, workers, previous):
        return {**previous, "nobody": [w for w in workers if all(w not in p for p in previous.values())]}


class Raises:
    def allocate(self, jobs, workers, previous):
        raise RuntimeError("policy bug")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with Lab(
        2, timeout=60, cache_dir=tmp_path_factory.mktemp("cache"), scheduler="fifo", interval=0.5
    ) as lab:
        yield lab


@pytest.fixture
def policy(lab):
    """The test's policy on the shared Lab; FIFO again afterwards, every run of the test ended."""
    yield lambda p: setattr(lab.scheduler, "policy", p)
    for run in lab.history:
        if not run.done:
            run.cancel()
    lab.scheduler.policy = FifoPolicy()


def first_last(run) -> tuple[float, float]:
    losses = run.losses
    return float(losses.iloc[:3].mean()), float(losses.iloc[-3:].mean())


@pytest.mark.timeout(180)
def test_two_runs_train_at_once_on_a_worker_each_and_a_third_waits_then_runs(lab, policy):
    torch.manual_seed(0)
    # more steps than they run: each is cancelled once both trained side by side, so the check
    # does not race a run that finishes early on a fast machine
    a = lab.launch(Net(), steps=100_000, data=Blobs(seed=1), batch_size=10, workers=1)
    b = lab.launch(Net(32), steps=100_000, data=Blobs(seed=2), batch_size=10, workers=1)
    c = lab.launch(Net(8), steps=60, data=Blobs(seed=3), batch_size=10, workers=1)
    poll_for(lambda: a.steps_done > 5 and b.steps_done > 5, 60, "both runs to train")
    assert a.status == b.status == "running" and c.status == "queued"
    assert len(set(a.workers) | set(b.workers)) == 2  # a worker each, not the same one
    frame = lab.queue.frame().set_index("run")
    assert frame.loc[c.id, "state"] == "queued" and frame.loc[c.id, "workers"] == 0
    poll_for(lambda: a.steps_done > 300 and b.steps_done > 300, 60, "300 steps each, side by side")
    assert c.status == "queued" and lab.queue.frame().set_index("run").loc[a.id, "goodput"] > 0
    a.cancel()
    c.wait(timeout=60, progress=False)  # a's worker came free: the queued run took it and finished
    b.cancel()
    assert c.status == "finished" and c.steps_done == 60 and c.workers
    for run in (a, b):  # each trained as it would alone: its loss fell
        first, last = first_last(run)
        assert last < 0.5 * first, (run.id, first, last)
    started = {e["run"]: e["time"] for e in reversed(lab.scheduler.events) if e["workers"]}
    ended = {e["run"]: e["time"] for e in lab.scheduler.events if not e["workers"]}
    assert started[c.id] >= ended[a.id]  # it started once a worker came free, not before
    held = {i["run"]: i["worker"] for i in lab.queue.intervals(runs=[a, b, c])}  # one stretch each
    assert held[c.id] == held[a.id] != held[b.id]  # c took the worker a freed
    assert len(lab.queue.plot(runs=[a, b, c]).data) == 3  # a lane per worker, a colour per run


@pytest.mark.timeout(120)
def test_a_loop_run_beside_another_run_is_priced_with_its_own_profile(lab, policy):
    """The scheduler holds a lab.run loop's profile, as a launch's (made on its loader's batch): what
    a cost model prices it with. It was None unless the run's forecast carried one, so a loop run
    beside another (no forecast: its step is not measured on workers others train on) was priced by
    its measurements alone."""

    def train(ctx):
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        loader = torch.utils.data.DataLoader(Blobs(seed=4), batch_size=10, shuffle=True)
        model, opt, loader = ctx.prepare(model, opt, loader)
        while ctx.step < 20:
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()

    a = lab.launch(Net(), steps=100_000, data=Blobs(seed=1), batch_size=10, workers=1)
    poll_for(lambda: a.steps_done > 2, 60, "the first run to train")
    b = lab.run(train, workers=1)
    job = lab.scheduler.job_of(b)
    assert job is not None and job.profile is not None and job.profile.batch_size == 10
    b.wait(60, progress=False)
    a.cancel()
    assert b.status == "finished"


@pytest.mark.timeout(120)
def test_a_queued_run_cancelled_leaves_the_queue_without_running(lab, policy):
    a = lab.launch(Net(), steps=100_000, data=Blobs(), batch_size=10, workers=2)
    b = lab.launch(Net(), steps=50, data=Blobs(), batch_size=10, workers=1)
    poll_for(lambda: a.steps_done > 0, 60, "the first run to train")
    assert b.status == "queued" and b.workers == []
    b.cancel()
    assert b.status == "cancelled" and b.done and len(b.metrics) == 0
    assert lab.queue.frame().set_index("run").loc[b.id, "state"] == "cancelled"
    a.cancel()
    assert a.status == "cancelled"


@pytest.mark.timeout(120)
def test_a_policy_over_capacity_naming_an_unknown_run_or_raising_keeps_the_allocation(lab, policy):
    a = lab.launch(Net(), steps=100_000, data=Blobs(), batch_size=10, workers=1)
    poll_for(lambda: a.steps_done > 0, 60, "the run to train")
    held, notes = tuple(a.workers), len(lab.scheduler.notes)
    for bad in (OverCapacity(), UnknownRun(), Raises()):
        policy(bad)
        assert lab.scheduler.step() == {a.id: held}
    new = lab.scheduler.notes[notes:]
    assert any("refused" in n and "unknown worker 'tcp://10.9.9.9:1'" in n for n in new), new
    assert any("refused" in n and "unknown job 'nobody'" in n for n in new), new
    assert any("RuntimeError: policy bug" in n and "previous allocation kept" in n for n in new), new
    at = a.steps_done
    poll_for(lambda: a.steps_done > at + 20, 30, "the run to keep training")
    assert tuple(a.workers) == held and a.restarts == 0 and a.status == "running"


@pytest.mark.timeout(180)
def test_a_run_that_fails_leaves_the_run_beside_it_training(lab, policy):
    torch.manual_seed(0)
    a = lab.launch(Net(), steps=100_000, data=Blobs(seed=4), batch_size=10, workers=1)
    broken = lab.launch(Net(), steps=800, data=Blobs(fail_after=300), batch_size=10, workers=1)
    with pytest.raises(LaunchError, match="a broken sample"):
        broken.wait(timeout=60, progress=False)
    assert a.status == "running"
    at = a.steps_done
    poll_for(lambda: a.steps_done > at + 100, 60, "100 more steps after its neighbour failed")
    a.cancel()
    first, last = first_last(a)
    assert a.restarts == 0 and a.error is None and last < 0.5 * first  # never paused, still learning


@pytest.mark.timeout(180)
def test_a_reallocation_resizes_a_run_at_the_exact_step(lab, policy):
    scripted = Scripted()
    policy(scripted)
    run = lab.launch(Net(), steps=100_000, data=Blobs(n=100), batch_size=10, min_workers=1, max_workers=2)
    scripted.counts[run.id] = 1
    lab.scheduler.step()
    poll_for(lambda: run.steps_done >= 30, 60, "30 steps on one worker")
    scripted.counts[run.id] = 2
    assert len(lab.scheduler.step()[run.id]) == 2
    poll_for(lambda: (run.metrics["restart"] == 1).sum() >= 40, 60, "20 steps on two workers")
    run.cancel()
    m = run.metrics
    r0 = m[m["rank"] == 0].sort_values("step")
    assert list(r0["step"]) == list(range(len(r0)))  # resumed at the step it paused at: none re-run
    assert list(r0.groupby("restart")["world"].first()) == [1, 2] and run.restarts == 1
    # each step moved the data position by its own global batch from 0: every sample once per epoch
    assert (r0["samples"].to_numpy() == (r0["world"].to_numpy() * 10).cumsum()).all()
    assert lab.scheduler.reallocations >= 1


@pytest.mark.timeout(120)
def test_without_a_scheduler_a_lab_runs_one_run_at_a_time_on_the_workers_asked_for(session_lab):
    lab = session_lab
    with pytest.raises(LaunchError, match="min_workers=/max_workers=: a Lab without a scheduler"):
        lab.launch(Net(), steps=10, data=Blobs(), min_workers=1)
    with pytest.raises(SchedulerError, match="lab.adapt: a Lab without a scheduler"):
        lab.adapt(1, 2)
    with pytest.raises(LaunchError, match="workers: 3 asked, but the Lab has 2; ask for 2 or fewer"):
        lab.launch(Net(), steps=10, data=Blobs(), workers=3)
    a = lab.launch(Net(), steps=100_000, data=Blobs(), batch_size=10, workers=1)
    try:
        poll_for(lambda: a.steps_done > 0, 60, "the run to train")
        assert len(a.workers) == 1 and a.world == 1
        with pytest.raises(
            LaunchError, match=f"run {a.id} is still running; run.wait\\(\\) or run.cancel\\(\\)"
        ):
            lab.launch(Net(), steps=10, data=Blobs(), batch_size=10, workers=1)
    finally:
        a.cancel()


class PSFaster:
    """The default cost model, except that on more than one replica it predicts PS twice as fast
    as the fastest other candidate. (It doubled PS's own figure until a machine where the default
    model priced PS at about half of AllReduce on two replicas: doubled, PS was 2.5% ahead, inside
    the scheduler's switch margin, and the run kept AllReduce.)"""

    def __init__(self) -> None:
        from distlab.costmodel import CostModel

        self.base = CostModel.default()

    def rank(self, profile, resources, plans, **kw):
        df = self.base.rank(profile, resources, plans, **kw)
        ps = (df["strategy"] == "PS") & (df["world"] > 1)
        if ps.any():
            factor = 2.0 * float(df.loc[~ps, "throughput"].max()) / float(df.loc[ps, "throughput"].max())
            for column, k in (("throughput", factor), ("step_time", 1 / factor), ("compute", 1 / factor)):
                df.loc[ps, column] *= k
        return df.sort_values("throughput", ascending=False).reset_index(drop=True)


@pytest.mark.timeout(180)
def test_a_run_that_lets_the_scheduler_choose_resumes_under_the_cost_models_best_and_a_named_one_keeps_its(
    lab, policy
):
    scripted = Scripted()
    policy(scripted)
    lab.scheduler.cost_model = PSFaster
    try:
        auto = lab.launch(
            Net(), "auto", steps=100_000, data=Blobs(n=100), batch_size=10, min_workers=1, max_workers=2
        )
        scripted.counts[auto.id] = 1
        lab.scheduler.step()
        poll_for(lambda: auto.steps_done >= 20, 60, "20 steps on one worker")
        assert auto.strategy.builder == "AllReduce"  # one replica: every strategy alike, none chosen
        scripted.counts[auto.id] = 2
        lab.scheduler.step()
        poll_for(lambda: (auto.metrics["restart"] == 1).sum() >= 40, 60, "20 steps on two workers")
        assert auto.strategy.builder == "PS"  # predicted twice as fast on two: it resumed as PS
        frame = lab.queue.frame().set_index("run")
        assert frame.loc[auto.id, "strategy"] == "PS (auto)"
        assert frame.loc[auto.id, "speedup"] == "cost model + measured"
        assert 0 < frame.loc[auto.id, "restart_s"] < 60  # measured: its relaunch and checkpoint
        assert any(f"run {auto.id} resumes as PS (was AllReduce)" in n for n in lab.scheduler.notes)
        auto.cancel()
        m = auto.metrics
        r0 = m[m["rank"] == 0].sort_values("step")
        assert list(r0["step"]) == list(range(len(r0)))  # resumed at the step it paused at
        assert (r0["samples"].to_numpy() == (r0["world"].to_numpy() * 10).cumsum()).all()
        first, last = first_last(auto)
        assert last < 0.5 * first  # it kept learning across the change of strategy

        named = lab.launch(
            Net(), "AllReduce", steps=100_000, data=Blobs(n=100), batch_size=10, min_workers=1, max_workers=2
        )
        scripted.counts[named.id] = 1
        lab.scheduler.step()
        poll_for(lambda: named.steps_done >= 10, 60, "10 steps on one worker")
        scripted.counts[named.id] = 2
        lab.scheduler.step()
        poll_for(lambda: (named.metrics["restart"] == 1).sum() >= 20, 60, "10 steps on two workers")
        named.cancel()
        assert named.strategy.builder == "AllReduce" and named.restarts == 1  # the user's choice kept
    finally:
        lab.scheduler.cost_model = None


def test_auto_on_a_lab_without_a_scheduler_is_one_error_naming_the_fix(session_lab):
    with pytest.raises(LaunchError, match="strategy='auto': only a shared Lab's scheduler chooses"):
        session_lab.launch(Net(), "auto", steps=10, data=Blobs())
