"""Pricing gossip on each rank's clock (costmodel/gossip_pricing.py): asynchronous gossip at every
rank's own pace, synchronous at the slowest's, the window traffic per out-neighbour, and the
consensus distance a topology's spectral gap leaves."""

from __future__ import annotations

import math

import pytest

import distlab as dl
from distlab import topology
from distlab.costmodel import gossip_pricing as gp
from distlab.errors import DistlabError
from tests.costmodel.toys import ALPHA, BETA, exact_model, toy_profile, toy_resources

MESSAGE = ALPHA + 16_000 * BETA  # one message of the toy's 4,000 float32 weights


@pytest.fixture(scope="module")
def prof():
    return toy_profile()  # 45 ms of forward and backward per step, 16 kB of weights


def gossip(prof, world=4, **kw):
    return dl.strategy.build("Gossip", prof, toy_resources(world), **kw)


def test_async_gossip_runs_each_rank_at_its_own_pace_and_sync_at_the_slowest(prof):
    cm, res = exact_model(), toy_resources(4)
    a, s = gossip(prof, asynchronous=True), gossip(prof)
    compute = cm.predict(prof, res, s).breakdown["compute"]
    slow_a = gp.price(cm, prof, res, a, slowdown={1: 2.0}, noise=0.0)
    slow_s = gp.price(cm, prof, res, s, slowdown={1: 2.0}, noise=0.0)
    # exp2 on 4 ranks: 2 out-neighbours each; no copies or optimizer in the exact model
    own = [compute * (2.0 if r == 1 else 1.0) + 2 * MESSAGE for r in range(4)]
    assert slow_a.throughput == pytest.approx(sum(32 / t for t in own), rel=1e-6)
    assert slow_a.step_time == pytest.approx(sum(own) / 4, rel=1e-6)
    assert "periods " + ", ".join(f"{t * 1e3:,.2f}" for t in own) + " ms" in slow_a.notes[-2]
    exchange = cm.predict(prof, res, s).breakdown["comm"]
    assert slow_s.throughput == pytest.approx(4 * 32 / (2 * compute + exchange), rel=1e-6)
    assert slow_a.throughput > 1.4 * slow_s.throughput  # three ranks do not wait for the fourth
    assert slow_a.step_time == pytest.approx(sum(slow_a.breakdown.values()), rel=1e-9)
    # without a straggler the two are close: asynchronous gossip saves no wait and pays no more wire
    fast_a, fast_s = gp.price(cm, prof, res, a, noise=0.0), cm.predict(prof, res, s)
    assert fast_a.throughput == pytest.approx(fast_s.throughput, rel=0.02)


def test_sync_gossip_without_a_straggler_keeps_the_kernels_price_and_says_its_consensus(prof):
    cm, res = exact_model(copy_per_byte=1e-10), toy_resources(8)
    s = gossip(prof, 8, topology="ring")
    p = cm.predict(prof, res, s)
    assert p.step_time == cm.evaluate_many(prof, res, [s])["step_time"][0]
    assert p.throughput == cm.evaluate_many(prof, res, [s])["throughput"][0]
    assert any(
        n.startswith("consensus: ring over 8 ranks, spectral gap 0.195") and "1.84 x u^2" in n
        for n in p.notes
    )
    jittered = gp.price(cm, prof, res, s, jitter=0.3, noise=0.0)
    assert jittered.step_time > 1.1 * p.step_time  # a rank waits for its neighbours' jitter


def test_the_window_traffic_grows_with_the_out_degree(prof):
    cm, res = exact_model(), toy_resources(8)
    sent = {
        name: gp.window_traffic(cm, res, gossip(prof, 8, topology=name, asynchronous=True), 16_000)
        for name in ("one_peer_exp2", "ring", "exp2", "full")
    }
    for name, degree in (("one_peer_exp2", 1), ("ring", 2), ("exp2", 3), ("full", 7)):
        assert sent[name] == pytest.approx([degree * MESSAGE] * 8)
    fast = [gp.price(cm, prof, res, gossip(prof, 8, topology=t, asynchronous=True)) for t in ("ring", "full")]
    assert fast[0].throughput > fast[1].throughput


@pytest.mark.parametrize(
    "name, n, lam",
    [
        ("ring", 4, 1 / 3),  # (1 + 2 cos(2 pi k / n)) / 3 at k = 1, 2
        ("ring", 8, (1 + math.sqrt(2)) / 3),
        ("exp2", 4, 1 / 3),  # |1 + w^k + w^2k| / 3, w = exp(2 pi i / n)
        ("exp2", 8, 1 / 2),  # k = 4: (1 - 1 + 1 + 1) / 4
    ],
)
def test_the_consensus_factor_is_lambda_squared_over_one_minus_it(name, n, lam):
    e = gp.expected_consensus(topology.get(name, n), update_spread=2.0)
    assert e.gap == pytest.approx(1 - lam)
    assert e.factor == pytest.approx(lam**2 / (1 - lam**2))
    assert e.distance == pytest.approx(2.0 * lam**2 / (1 - lam**2)) and e.lam == pytest.approx(lam)


def test_full_averages_in_one_step_and_a_schedule_counts_its_phases(prof):
    assert gp.expected_consensus(topology.get("full", 8)).factor == pytest.approx(0.0, abs=1e-12)
    # one-peer exp2 averages exactly once per period (gap 1), not within it: by phase, the slowest
    # mode's contraction squared summed over steps until the period ends (offsets 1, 2, 4)
    c = math.cos(math.pi / 8) ** 2
    e = gp.expected_consensus(topology.get("one_peer_exp2", 8))
    assert e.gap == pytest.approx(1.0) and e.factor == pytest.approx((c + c / 2 + 2 + 1.5) / 3)
    # AWC applies the step's update after the combine: one u^2 more
    awc = gp.expected_consensus(gossip(prof, 4, mode="awc"), update_spread=1.0)
    assert awc.distance == pytest.approx(awc.factor + 1.0)


def test_asynchronously_a_slow_neighbour_mixes_less_per_own_step():
    e = gp.expected_consensus(topology.get("exp2", 4), periods=[1.0, 1.0, 1.0, 2.0])
    # 2 of exp2's 8 edges leave the slow rank, heard every other step
    assert e.heard == pytest.approx(7 / 8, abs=0.01)
    lam = 1 - e.heard * 2 / 3  # the lazy mix (1 - h) I + h W: eigenvalue 1/3 -> 1 - h + h / 3
    assert e.factor == pytest.approx(lam**2 / (1 - lam**2)) and e.factor > 0.125
    assert "takes in 88% of its neighbours' messages" in e.note()


def test_the_cost_model_routes_async_gossip_and_ranks_it(prof):
    cm, res = exact_model(), toy_resources(4)
    a = gossip(prof, asynchronous=True, mode="average")
    p = cm.predict(prof, res, a)
    assert any(n.startswith("asynchronous gossip (average): every rank at its own pace") for n in p.notes)
    assert any(n.startswith("consensus: exp2 over 4 ranks") for n in p.notes)
    assert p.throughput == pytest.approx(gp.price(cm, prof, res, a).throughput)
    table = cm.rank(prof, res, [gossip(prof), a])
    row = table[[plan is a for plan in table["plan"]]].iloc[0]
    assert row["throughput"] == pytest.approx(p.throughput) and row["step_time"] == pytest.approx(p.step_time)


def test_the_candidates_offer_async_gossip_beside_sync(prof):
    def modes(world, profile=prof):
        cands = dl.strategy.candidates(profile, toy_resources(world))
        return {(c.gossip.topology, c.gossip.mode) for c in cands if c.gossip and c.gossip.asynchronous}

    assert modes(4) == {("exp2", "push_sum"), ("one_peer_exp2", "push_sum"), ("exp2", "average")}
    assert modes(3) == {("exp2", "push_sum"), ("exp2", "average")}  # one-peer exp2 needs a power of two
    assert modes(1) == set()
    sparse = dl.ModelProfile.from_variables(
        [("emb.weight", (100, 8), "float32", True), ("fc.weight", (8, 8))]
    )
    assert modes(4, sparse) == set()  # sparse gradients cannot be averaged asynchronously


def test_bad_input_is_one_line_naming_the_field(prof):
    cm, res, a = exact_model(), toy_resources(4), gossip(prof, asynchronous=True)
    for kw, text in (
        ({"slowdown": {9: 2.0}}, r"slowdown\[9\]: not a rank of this strategy \(0 to 3\)"),
        ({"slowdown": {1: 0.5}}, r"slowdown\[1\]: factor 0.5 must be a number >= 1"),
        ({"slowdown": [2.0]}, r"slowdown: expected \{rank: factor\}"),
        ({"jitter": -0.1}, r"jitter: -0.1 must be a finite number >= 0"),
        ({"update_spread": -1.0}, r"update_spread: -1.0 must be a number >= 0"),
    ):
        with pytest.raises(DistlabError, match=text) as err:
            gp.price(cm, prof, res, a, **kw)
        assert "\n" not in str(err.value)
    with pytest.raises(DistlabError, match="neither a topology nor a gossip strategy"):
        gp.expected_consensus("exp2")
    with pytest.raises(DistlabError, match="has no gossip settings"):
        gp.price(cm, prof, res, dl.strategy.build("AllReduce", prof, res))


def test_a_rank_whose_link_cannot_take_in_its_neighbours_messages_slows_them_to_it():
    big = toy_profile(sizes=(1_000_000,), bwd=(1e-4,), fwd=1e-4)  # 4 MB of weights, 0.2 ms of compute
    cm, res = exact_model(), toy_resources(8)
    star = dl.strategy.build("Gossip", big, res, topology="star", asynchronous=True)
    p = gp.price(cm, big, res, star, noise=0.0)
    t = ALPHA + 4e6 * BETA
    compute = cm.predict(big, res, star, clocks=False).breakdown["compute"]
    leaf = compute + t  # a leaf sends to the centre only; the centre takes in 7 of its messages
    busy = 7 * t / leaf
    assert busy > 1 and any("bounded by the busiest rank's incoming link" in n for n in p.notes)
    periods = [(compute + 7 * t) * busy] + [leaf * busy] * 7
    assert p.throughput == pytest.approx(sum(32 / q for q in periods), rel=1e-6)
