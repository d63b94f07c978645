"""The step graph and its replay on traces built by hand (every duration known): the identity
replay reproduces the run, each what-if moves the step the way its physics says, and a trace that
cannot answer gets one line saying what is missing."""

from __future__ import annotations

import json

import numpy as np
import pytest

import distlab as dl
from distlab.errors import ResourceError
from distlab.resources import ResourceSpec
from distlab.strategy.types import RankSpec, Strategy, Sync, VariablePlan
from distlab.whatif import Trace, TraceError
from distlab.whatif.graph import build
from distlab.whatif.replay import replay
from distlab.whatif.trace import TraceData

MS = 1e-3
VARS = [
    ("fc2.bias", 16, 0.2),
    ("fc2.weight", 4096, 0.25),
    ("fc1.bias", 256, 0.6),
    ("fc1.weight", 2_000_000, 0.7),
]


def _strategy(kind: str = "allreduce", world: int = 2) -> Strategy:
    ranks = tuple(RankSpec(r, "localhost") for r in range(world))
    sync = Sync(kind, server=0) if kind == "ps" else Sync(kind)
    return Strategy(
        variables=tuple(VariablePlan(name, sync) for name, _, _ in VARS),
        ranks=ranks,
        servers=(0,) if kind == "ps" else (),
        builder={"allreduce": "AllReduce", "ps": "PS"}[kind],
    )


def fabricated(world: int = 2, steps: int = 6, bucket: float = 3 * MS, slow_rank: float = 1.0) -> TraceData:
    """A run whose every span is known: per step a 0.2 ms gap, forward 2 ms, backward 4 ms (one
    bucket launched at 70% of it, taking ``bucket``), the wait, the optimizer 1 ms."""
    spans, ends = [], np.zeros(world)
    for s in range(steps):
        t = ends + 0.2 * MS
        fwd = 2 * MS * np.array([slow_rank if r == world - 1 else 1.0 for r in range(world)])
        bstart = t + fwd
        bend = bstart + 4 * MS
        launch = bstart + 0.7 * 4 * MS
        done = launch.max() + bucket
        wait_end = np.maximum(bend, done) + 0.05 * MS
        opt_end = wait_end + 1 * MS
        for r in range(world):
            ready = [[v, b, f * 4 * MS] for v, b, f in VARS]
            spans += [
                _span("forward", "forward", t[r], bstart[r], r, s),
                _span("backward", "backward", bstart[r], bend[r], r, s, ready=ready),
                _span("waiting for gradient communication", "wait", bend[r], wait_end[r], r, s),
                _span("optimizer", "optimizer", wait_end[r], opt_end[r], r, s),
                _span("all-reduce bucket 0", "allreduce", launch[r], done, r, s, "comm", bytes=2_004_368),
            ]
        ends = opt_end
    return TraceData(
        spans, world, ["localhost"] * world, {"localhost": 2}, 32.0 * world, _strategy(world=world)
    )


def _span(name, cat, start, end, rank, step, track="compute", **args):
    return {
        "name": name,
        "cat": cat,
        "track": track,
        "start": float(start),
        "end": float(end),
        "rank": rank,
        "step": step,
        "args": args,
    }


def test_the_identity_replay_reproduces_the_run_it_came_from():
    for data, slow in ((fabricated(), 1.0), (fabricated(world=4, slow_rank=1.5), 1.5)):
        g = build(data)
        assert len(g.compute) == 4 and [n.kind for n in g.comm] == ["allreduce"]
        assert g.comm[0].ready == pytest.approx(0.7)
        assert [v for v, _, _ in g.ready] == [v for v, _, _ in VARS]  # ready order, from the trace
        r = replay(g)
        assert r.step_time == pytest.approx(g.measured_step, rel=1e-9)
        # by hand: gap + forward (the slowest) + 70% backward + bucket + tail + optimizer
        assert r.step_time == pytest.approx((0.2 + 2 * slow + 2.8 + 3 + 0.05 + 1) * MS)
    edges = build(fabricated()).edges()
    assert ("forward", "backward", "program order") in edges
    assert (
        "all-reduce bucket 0",
        "waiting for gradient communication",
        "the optimizer waits for its gradients",
    ) in edges


def test_what_ifs_move_the_step_as_their_physics_says():
    t = Trace(fabricated(bucket=6 * MS), dl.CostModel.default())
    base = t.whatif()
    assert base.step_time == pytest.approx(t.measured_step, rel=1e-9) and base.changes == {}
    # overlap off: the bucket waits for the end of backward, so 30% of backward more is exposed
    assert t.whatif(overlap=False).step_time == pytest.approx(base.step_time + 0.3 * 4 * MS)
    # a device twice as fast halves forward, backward and the optimizer, not the communication
    fast = t.whatif(compute_scale=0.5)
    assert fast.breakdown["compute"] == pytest.approx(base.breakdown["compute"] / 2)
    assert fast.step_time > base.step_time - 0.5 * (2 + 4 + 1) * MS
    # a tenth of the bandwidth: the bucket's beta part grows tenfold
    slow = t.whatif(bandwidth=dl.CostModel.default().links()["intra"].bandwidth / 10)
    assert slow.step_time > base.step_time + 5 * MS
    # more ranks on the same 2 cores: ring all-reduce costs more and CPU work is time-sliced
    w4 = t.whatif(world=4)
    assert w4.replayed.graph.world == 4 and w4.breakdown["compute"] == pytest.approx(
        2 * base.breakdown["compute"]
    )
    assert w4.breakdown["comm"] > base.breakdown["comm"]
    assert w4.throughput == pytest.approx(w4.replayed.graph.samples_per_step / w4.step_time)
    assert any("time slicing" in n for n in w4.notes)
    # the trace's own buckets against the runtime's layout at 0.25 MiB: the big weight alone in one
    small = t.whatif(bucket_mb=0.25)
    assert sum(n.kind == "allreduce" for n in small.replayed.graph.comm) == 2
    # a trace whose strategy all-reduces nothing has nothing to re-bucket, and says so
    ps_trace = Trace(
        TraceData(fabricated().spans, 2, ["h"] * 2, {}, 64.0, _strategy("ps")), dl.CostModel.default()
    )
    assert any("nothing to re-bucket" in n for n in ps_trace.whatif(bucket_mb=1).notes)
    big = t.whatif(world=1024, hosts=128)
    assert big.replayed.graph.world == 1024 and np.isfinite(big.step_time)


def test_a_strategy_swap_replaces_the_communication_and_the_optimizer_share():
    t = Trace(fabricated(), dl.CostModel.default())
    ps = t.whatif(strategy=_strategy("ps"))
    g = ps.replayed.graph
    assert [n.kind for n in g.comm] == ["ps_push"] * len(VARS)
    assert [n.kind for n in g.compute][-1] == "ps_pull"
    opt = next(n for n in g.compute if n.kind == "optimizer")
    assert opt.dur[:, 0].mean() == pytest.approx(1 * MS) and opt.dur[:, 1].mean() == pytest.approx(0.0)
    assert any("priced by the cost model alone" in n for n in ps.notes)
    pull = next(n for n in g.compute if n.kind == "ps_pull")
    assert pull.calls == len(VARS)  # runtime/ps.py broadcasts each PS variable on its own
    assert ps.changes == {"strategy": "PS"}
    # each call's work around the wire is CPU work of the rank that launches it from backward:
    # 4 PS pushes in place of the trace's one bucket add 3 calls' work to backward
    import dataclasses

    base = dl.CostModel.default()
    busy = base.with_params(dataclasses.replace(base.params, call_overhead=1 * MS))
    slow = Trace(fabricated(), busy).whatif(strategy=_strategy("ps")).replayed.graph
    b0 = next(n for n in g.compute if n.kind == "backward")
    b1 = next(n for n in slow.compute if n.kind == "backward")
    assert b1.dur.mean() == pytest.approx(b0.dur.mean() + 3 * MS)
    # a swap to all-reduce with a bucket cap lays its buckets at that cap
    one = t.whatif(strategy=_strategy("allreduce"), bucket_mb=0.25).replayed.graph.comm
    assert sum(n.kind == "allreduce" for n in one) == 2


def test_what_the_trace_cannot_answer_gets_one_line_naming_it(tmp_path):
    t = Trace(fabricated(), dl.CostModel.default())
    with pytest.raises(ResourceError, match=r"whatif: world must be an integer >= 1, got 0"):
        t.whatif(world=0)
    with pytest.raises(ResourceError, match=r"whatif\(bandwidth=-1\)"):
        t.whatif(bandwidth=-1)
    other = Strategy(
        variables=(VariablePlan("emb.weight", Sync("allreduce")),),
        ranks=(RankSpec(0, "localhost"), RankSpec(1, "localhost")),
    )
    with pytest.raises(TraceError, match="'emb.weight' is not in the trace"):
        t.whatif(strategy=other)
    with pytest.raises(TraceError, match="builder's name needs the model's profile"):
        t.whatif(strategy="PS")
    no_ready = fabricated()
    for e in no_ready.spans:
        e["args"].pop("ready", None)
    with pytest.raises(TraceError, match="ready instant"):
        Trace(no_ready).whatif(bucket_mb=1)
    with pytest.raises(TraceError, match="at least 2"):
        Trace(TraceData([e for e in fabricated().spans if e["step"] == 0], 2, ["h"] * 2, {}, 64.0))
    with pytest.raises(TraceError, match="rank 1 has no optimizer span"):
        Trace(
            TraceData(
                [e for e in fabricated().spans if not (e["rank"] == 1 and e["cat"] == "optimizer")],
                2,
                ["h"] * 2,
                {},
                64.0,
            )
        )
    (tmp_path / "cut.json").write_text('{"traceEvents": [{"ph": "X", "na')
    with pytest.raises(TraceError, match="truncated or not a trace"):
        dl.whatif.load(tmp_path / "cut.json")
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": [], "displayTimeUnit": "ms"}))
    with pytest.raises(TraceError, match="not a distlab trace"):
        dl.whatif.load(tmp_path / "other.json")
    with pytest.raises(TraceError, match="no such file"):
        dl.whatif.load(tmp_path / "missing.json")


def test_the_analytic_prediction_stands_beside_the_replay_when_the_profile_came_with_it():
    from distlab.profiling.model_profile import ModelProfile, VariableProfile

    prof = ModelProfile(
        variables=tuple(VariableProfile(v, (b // 4,), "float32", b) for v, b, _ in VARS), batch_size=32
    )
    res = ResourceSpec.local(2)
    t = Trace(fabricated(), dl.CostModel.default(), res, prof)
    w = t.whatif()
    assert w.analytic is not None and "replay" in w.difference and "analytic" in w.difference
    assert "analytic" not in " ".join(w.notes)
    assert t.whatif(bucket_mb=1).analytic is None
    assert any("no knob for bucket_mb" in n for n in t.whatif(bucket_mb=1).notes)


def test_the_picker_given_a_trace_shows_the_replay_beside_its_prediction():
    from distlab.notebook.picker import StrategyPicker
    from distlab.profiling.model_profile import ModelProfile, VariableProfile

    prof = ModelProfile(
        variables=tuple(VariableProfile(v, (b // 4,), "float32", b) for v, b, _ in VARS), batch_size=32
    )
    picker = StrategyPicker(prof, ResourceSpec.local(2), dl.CostModel.default(), trace=Trace(fabricated()))
    line = picker.status.value
    assert "trace replayed with this plan" in line and "vs analytic" in line
    picker.builder.value = "PS"
    assert "replayed with this plan" in picker.status.value and "PS" in picker.status.value
