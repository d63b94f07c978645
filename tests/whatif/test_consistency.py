"""Replays that know consistency, on traces built by hand by the runtime's own rules (every
duration known): a stale PS's read waits at its gate (runtime/stale_ps.py ``ready``) and then for
its own answer, an asynchronous PS and asynchronous gossip run each rank at its own pace, and a
swap to a stale or asynchronous plan is replayed from a trace that measured one, or refused
naming the analytic path."""

from __future__ import annotations

import numpy as np
import pytest

import distlab as dl
from distlab.strategy.types import GossipConfig, RankSpec, Strategy, Sync, VariablePlan
from distlab.whatif import Trace, TraceError
from distlab.whatif.trace import TraceData

MS = 1e-3
VARS = [("fc.bias", 64, 0.3), ("fc.weight", 40_000, 0.8)]
GAP, FWD, BWD, OPT = 0.2 * MS, 2 * MS, 3 * MS, 0.5 * MS
PUSH, ANSWER, EXCHANGE = 0.6 * MS, 0.8 * MS, 0.7 * MS


def _strategy(kind: str, world: int = 2, sync: bool = True, staleness: int = 0, asynchronous: bool = False):
    ranks = tuple(RankSpec(r, "localhost") for r in range(world))
    if kind == "ps":
        plan = Sync("ps", server=0, sync=sync, staleness=staleness)
        return Strategy(tuple(VariablePlan(v, plan) for v, _, _ in VARS), ranks, servers=(0,), builder="PS")
    if kind == "gossip":
        return Strategy(
            tuple(VariablePlan(v, Sync("gossip")) for v, _, _ in VARS),
            ranks,
            gossip=GossipConfig(
                "ring", mode="push_sum" if asynchronous else "atc", asynchronous=asynchronous
            ),
            builder="Gossip",
        )
    return Strategy(tuple(VariablePlan(v, Sync("allreduce")) for v, _, _ in VARS), ranks, builder="AllReduce")


def _span(name, cat, start, end, rank, step, **args):
    return {
        "name": name,
        "cat": cat,
        "track": "compute",
        "start": float(start),
        "end": float(end),
        "rank": rank,
        "step": step,
        "args": args,
    }


def _loop(t: float, r: int, c: int, slow: float) -> tuple[list[dict], float]:
    """Forward, backward, the (empty) gradient wait and the optimizer of rank ``r`` at step ``c``."""
    ready = [[v, b, f * BWD] for v, b, f in VARS]
    f0 = t + GAP
    b0 = f0 + FWD * slow
    spans = [
        _span("forward", "forward", f0, b0, r, c),
        _span("backward", "backward", b0, b0 + BWD, r, c, ready=ready),
        _span("waiting for gradient communication", "wait", b0 + BWD, b0 + BWD, r, c),
        _span("optimizer", "optimizer", b0 + BWD, b0 + BWD + OPT, r, c),
    ]
    return spans, b0 + BWD + OPT


def stale_ps(staleness: int | None, slow: float = 1.0, steps: int = 16) -> TraceData:
    """A stale (``staleness`` s) or asynchronous (None) PS run, rank 1 ``slow`` times slower in
    forward: each step pushes (``PUSH``), then reads: at s, once every rank pushed the step s before
    (``StalePS.ready``), then its own answer (``ANSWER``)."""
    spans, t = [], np.zeros(2)
    pushes: list[np.ndarray] = []
    for c in range(steps):
        ends = np.zeros(2)
        for r in range(2):
            loop, end = _loop(t[r], r, c, slow if r == 1 else 1.0)
            spans += loop
            spans.append(
                _span(
                    "PS push (stale)" if staleness is not None else "PS push (async)",
                    "ps",
                    end,
                    end + PUSH,
                    r,
                    c,
                )
            )
            ends[r] = end + PUSH
        pushes.append(ends)
        for r in range(2):
            gate = pushes[c - staleness].max() if staleness is not None and c - staleness >= 0 else -np.inf
            done = max(ends[r], gate) + ANSWER
            spans.append(_span("PS read (waits for the slowest's clock)", "wait", ends[r], done, r, c))
            t[r] = done
    st = _strategy("ps", sync=staleness is not None, staleness=staleness or 0)
    return TraceData(spans, 2, ["localhost"] * 2, {"localhost": 2}, 64.0, st)


def gossip(asynchronous: bool, slow: float = 2.0, steps: int = 16) -> TraceData:
    """Gossip on a ring of 2, rank 1 ``slow`` times slower in forward: asynchronous, each rank's
    exchange takes ``EXCHANGE`` at its own pace; synchronous, it starts when its in-neighbour
    arrives (runtime/gossip.py)."""
    spans, t = [], np.zeros(2)
    for c in range(steps):
        starts = np.zeros(2)
        for r in range(2):
            loop, starts[r] = _loop(t[r], r, c, slow if r == 1 else 1.0)
            spans += loop
        for r in range(2):
            end = (starts[r] if asynchronous else starts.max()) + EXCHANGE
            spans.append(
                _span("gossip exchange", "gossip", starts[r], end, r, c, bytes=160_256, peers=[1 - r])
            )
            t[r] = end
    st = _strategy("gossip", asynchronous=asynchronous)
    return TraceData(spans, 2, ["localhost"] * 2, {"localhost": 2}, 64.0, st)


def _own(slow: float) -> float:
    return GAP + FWD * slow + BWD + OPT


def test_a_stale_ps_read_waits_at_its_gate_and_then_for_its_own_answer():
    # no straggler: every read waits only for its own answer; the old replay gave the read the
    # other wait's tail (0 here) and joined every rank at the push, losing ANSWER each step
    t = Trace(stale_ps(2))
    assert [n.kind for n in t.graph.compute][-2:] == ["ps_stale", "ps_read"]
    assert t.identity.step_time == pytest.approx(_own(1.0) + PUSH + ANSWER, rel=1e-6)
    assert t.identity.step_time == pytest.approx(t.measured_step, rel=1e-6)
    # a 3x straggler at s=1: the fast rank runs ahead, then its gate holds it at the slow one's pace
    t = Trace(stale_ps(1, slow=3.0, steps=24))
    slow_pace = _own(3.0) + PUSH + ANSWER
    assert t.graph.measured_rank_steps == pytest.approx([slow_pace, slow_pace], rel=1e-6)
    assert t.identity.rank_step_times == pytest.approx(t.graph.measured_rank_steps, rel=1e-6)
    edges = t.graph.edges()
    assert (
        "PS push (stale)",
        "PS read (waits for the slowest's clock)",
        "every rank's push of 1 step(s) before",
    ) in edges


def test_an_asynchronous_ps_keeps_each_rank_at_its_own_pace():
    t = Trace(stale_ps(None, slow=3.0))
    fast, slow = _own(1.0) + PUSH + ANSWER, _own(3.0) + PUSH + ANSWER
    assert t.graph.measured_rank_steps == pytest.approx([fast, slow], rel=1e-6)
    # the old replay joined every rank at the push (a barrier each step): the fast rank went at
    # the slow one's pace
    assert t.identity.rank_step_times == pytest.approx([fast, slow], rel=1e-6)
    assert t.identity.step_time == pytest.approx(t.measured_step, rel=1e-6)


def test_asynchronous_gossip_joins_no_in_neighbour():
    t = Trace(gossip(asynchronous=True))
    fast, slow = _own(1.0) + EXCHANGE, _own(2.0) + EXCHANGE
    assert t.identity.rank_step_times == pytest.approx([fast, slow], rel=1e-6)
    assert ("gossip exchange", "gossip exchange", "joins each rank's in-neighbours") not in t.graph.edges()
    # the synchronous run of the same work: the fast rank waits for its in-neighbour every step
    sync = Trace(gossip(asynchronous=False))
    assert sync.identity.rank_step_times == pytest.approx([slow, slow], rel=1e-6)
    assert sync.identity.step_time == pytest.approx(sync.measured_step, rel=1e-6)


def test_swaps_to_a_consistency_replay_it_or_say_which_path_prices_it():
    cm = dl.CostModel.default()
    # a synchronous gossip trace swapped to asynchronous gossip: the same exchange, no join
    sync = Trace(gossip(asynchronous=False), cm)
    same = sync.whatif(strategy=_strategy("gossip")).replayed.rank_step_times
    assert same[0] == pytest.approx(same[1], rel=1e-6)  # joined: the fast rank at the slow one's pace
    w = sync.whatif(strategy=_strategy("gossip", asynchronous=True))
    # its own pace: the straggler's extra forward (FWD) is not the fast rank's
    assert w.replayed.rank_step_times[0] < w.replayed.rank_step_times[1] - 0.75 * FWD
    assert all(n.alone for n in w.replayed.graph.compute if n.kind == "gossip")
    # a stale PS trace to another gate: its own pushes and reads under the new one
    traced = Trace(stale_ps(None, slow=3.0), cm)
    gated = traced.whatif(strategy=_strategy("ps", staleness=1))
    slow = _own(3.0) + PUSH + ANSWER
    assert gated.replayed.rank_step_times == pytest.approx([slow, slow], rel=0.02)
    assert any("consistency stale-synchronous (staleness 1)" in n for n in gated.notes)
    free = Trace(stale_ps(1, slow=3.0, steps=24), cm).whatif(strategy=_strategy("ps", sync=False))
    assert free.replayed.rank_step_times[0] < 0.7 * free.replayed.rank_step_times[1]
    # what no trace measured is refused in one line naming the analytic path
    sync_trace = Trace(gossip(asynchronous=False), cm)
    with pytest.raises(TraceError, match=r"stale-synchronous \(staleness 2\) PS .*cm\.predict"):
        sync_trace.whatif(strategy=_strategy("ps", staleness=2))
    with pytest.raises(TraceError, match=r"asynchronous PS .*cm\.predict"):
        sync_trace.whatif(strategy=_strategy("ps", sync=False))
    with pytest.raises(TraceError, match="optimizer ran inside its pushes"):
        traced.whatif(strategy=_strategy("allreduce"))


def test_the_picker_says_when_the_replay_does_not_apply():
    from distlab.profiling.model_profile import ModelProfile, VariableProfile
    from distlab.resources import ResourceSpec
    from distlab.whatif import replay_clause

    prof = ModelProfile(
        variables=tuple(VariableProfile(v, (b // 4,), "float32", b) for v, b, _ in VARS), batch_size=32
    )
    res = ResourceSpec.local(2)
    cm = dl.CostModel.default()
    stale = dl.strategy.build("PS", prof, res, staleness=2)
    predicted = cm.predict(prof, res, stale)
    _, line = replay_clause(Trace(gossip(asynchronous=False), cm), cm, stale, res, predicted, None)
    assert "replay does not apply" in line and "cm.predict" in line and "samples/s" not in line
    # an asynchronous replay beside a figure of every rank's mean says whose step it shows
    agossip = dl.strategy.build("Gossip", prof, res, asynchronous=True, topology="ring")
    _, line = replay_clause(
        Trace(gossip(asynchronous=True), cm), cm, agossip, res, cm.predict(prof, res, agossip), None
    )
    assert "replayed with this plan" in line and "ranks at their own paces" in line
