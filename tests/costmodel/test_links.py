"""Per-host link traffic (costmodel/links.py): which bytes cross which host's link in each phase, the
share loss calibration fits, and what predictions on several hosts make of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import distlab as dl
from distlab.costmodel import CostModel
from distlab.costmodel.calibrate import fit_shared_link
from distlab.costmodel.links import broadcast_edges, gossip_rounds, host_index, ps_gathers, ps_values
from distlab.costmodel.rows import CollectiveRow
from distlab.errors import LaunchError, ResourceError, StrategyError
from distlab.resources import Link, RankSpec, ResourceSpec
from distlab.strategy.execution import for_strategy
from distlab.strategy.types import Strategy

LINK = 25e6  # bytes/s between hosts (200 Mbit/s)


def hosts(per_host=(2, 2), rate=LINK) -> ResourceSpec:
    ranks, r = [], 0
    for h, n in enumerate(per_host):
        for d in range(n):
            ranks.append(RankSpec(r, f"10.0.0.{h + 1}", f"cpu:{d}"))
            r += 1
    return ResourceSpec(
        ranks=tuple(ranks),
        cores={f"10.0.0.{h + 1}": n for h, n in enumerate(per_host)},
        links={"intra": Link(20e-6, 2e9), "inter": Link(100e-6, rate)},
    )


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


@pytest.fixture(scope="module")
def prof():
    return dl.profile(mlp(), sample_input=torch.randn(32, 64), batch_size=32)


def test_broadcast_edges_follow_gloos_binomial_tree_from_any_root():
    assert broadcast_edges(0, 4) == [(0, 1), (0, 2), (1, 3)]
    assert broadcast_edges(1, 4) == [(1, 2), (1, 3), (2, 0)]
    edges = broadcast_edges(2, 5)
    assert sorted(dst for _, dst in edges) == [0, 1, 3, 4]  # everyone but the root, once
    assert broadcast_edges(0, 1) == []


def test_a_single_server_sends_its_values_out_of_its_host_in_as_many_flows_as_the_tree_crosses(prof):
    res = hosts()
    st = dl.strategy.build("PS", prof, res, batch_size=32)
    nbytes = sum(v.nbytes for v in prof.variables)
    load = ps_values(st, [(0, nbytes)])
    # rank 0 -> 1 stays home; 0 -> 2 and 1 -> 3 cross: two flows out of host 1, into host 2
    assert load[:, 0].tolist() == [0.0, 0.0, 2 * nbytes, 2.0]
    assert load[:, 1].tolist() == [2 * nbytes, 2.0, 0.0, 0.0]
    gathered = ps_gathers(st, [(0, 1000.0)])
    assert gathered[:, 0].tolist() == [2000.0, 2.0, 0.0, 0.0]  # ranks 2 and 3 send their rows home


def test_hierarchical_gossip_crosses_hosts_on_outer_steps_only_and_flat_gossip_every_step(prof):
    res = hosts()
    hier = dl.strategy.build("Gossip", prof, res, batch_size=32, topology="hierarchical")
    rounds = gossip_rounds(hier, for_strategy(hier))
    assert rounds.intra_degree.tolist() == [1.0, 0.0] and rounds.flows_in.tolist() == [0.0, 2.0]
    flat = dl.strategy.build("Gossip", prof, res, batch_size=32)
    rounds = gossip_rounds(flat, for_strategy(flat))
    assert rounds.flows_in.max() >= 2 and len(rounds.flows_in) == 1
    names, where = host_index(flat)
    assert names == ["10.0.0.1", "10.0.0.2"] and where.tolist() == [0, 0, 1, 1]


def test_the_share_loss_is_fitted_from_concurrent_flows_against_one_flow_alone():
    alpha, beta = 1e-4, 1 / LINK
    # incast: k flows into one link, 20% slower per byte per extra flow; outcast: fair sharing,
    # exactly k times one flow
    rows = [
        CollectiveRow(
            collective=name,
            world=k + 1,
            nbytes=n,
            flows=k,
            link="inter",
            seconds=alpha + k * n * beta * (1 + loss * (k - 1)),
        )
        for name, loss in (("incast", 0.2), ("outcast", 0.0))
        for k in (2, 3)
        for n in (1 << 20, 4 << 20, 16 << 20)
    ]
    fit = fit_shared_link(rows, (alpha, beta))
    assert fit["incast"] == pytest.approx(0.2, rel=1e-6) and fit["outcast"] == pytest.approx(0.0, abs=1e-9)
    assert fit["errors"]["incast"] < 1e-6
    assert fit_shared_link(rows, None) == {"errors": {}}  # one host: no link measured, nothing fitted


def test_ps_on_two_hosts_costs_the_bytes_its_servers_push_through_one_link(prof):
    cm = CostModel.default()
    two = hosts()
    one = hosts((4,))
    st2 = dl.strategy.build("PS", prof, two, batch_size=32)
    st1 = dl.strategy.build("PS", prof, one, batch_size=32)
    p2, p1 = cm.predict(prof, two, st2, optimizer="sgd"), cm.predict(prof, one, st1, optimizer="sgd")
    # the values after the step: two flows of the whole model out of the server's host, at the link's rate
    nbytes = sum(v.nbytes for v in prof.variables)
    assert p2.detail["broadcast"] >= 2 * nbytes / LINK
    assert p1.detail["broadcast"] < 0.2 * p2.detail["broadcast"]
    note = [n for n in p2.notes if n.startswith("bottleneck:")]
    assert note and "out of 10.0.0.1" in note[0] and "2 flows" in note[0], p2.notes
    assert not [n for n in p1.notes if n.startswith("bottleneck:")]  # one host has no link to name


def test_one_host_predicts_as_before_the_link_terms(prof):
    cm = CostModel.default()
    res = hosts((4,))
    for name in ("PS", "AllReduce", "Gossip", "PartitionedPS"):
        st = dl.strategy.build(name, prof, res, batch_size=32)
        c = cm.compile(prof, st)
        assert c.values_link.size == 0 and c.gather_link.size == 0 and c.gossip_flows_in.size == 0


def test_a_faster_link_moves_the_bottleneck_off_the_link(prof):
    cm = CostModel.default()
    slow, fast = hosts(rate=25e6), hosts(rate=1.25e9)
    st_slow = dl.strategy.build("PSLoadBalancing", prof, slow, batch_size=32)
    st_fast = dl.strategy.build("PSLoadBalancing", prof, fast, batch_size=32)
    p_slow = cm.predict(prof, slow, st_slow, optimizer="sgd")
    p_fast = cm.predict(prof, fast, st_fast, optimizer="sgd")
    assert p_fast.throughput > 2 * p_slow.throughput
    assert any(n.startswith("bottleneck:") for n in p_slow.notes)


def test_hosts_of_unequal_ranks_are_priced_per_host_and_a_hierarchy_that_does_not_divide_is_refused(prof):
    cm = CostModel.default()
    res = hosts((3, 1))
    st = dl.strategy.build("PS", prof, res, batch_size=32)
    c = cm.compile(prof, st)
    # from rank 0's host: 0 -> 1, 0 -> 2 stay; 1 -> 3 crosses (3 is alone on the second host)
    assert c.values_link[3, 0] == 1.0 and c.values_link[1, 1] == 1.0
    assert cm.predict(prof, res, st, optimizer="sgd").throughput > 0
    with pytest.raises(StrategyError, match="same number of ranks on every host"):
        dl.strategy.build("Gossip", prof, res, batch_size=32, topology="hierarchical")


def test_a_server_that_is_no_rank_and_a_link_of_no_speed_are_one_line_each(prof):
    res = hosts()
    d = dl.strategy.build("PS", prof, res, batch_size=32).to_dict()
    d["servers"] = [7]
    for v in d["variables"]:
        v["sync"]["server"] = 7
    with pytest.raises(StrategyError, match=r"servers\[0\]: rank 7 does not exist"):
        Strategy.from_dict(d)
    from distlab.costmodel.whatif import with_network

    for bad in (0.0, -1e9):
        with pytest.raises(ResourceError, match="bandwidth must be positive"):
            with_network(CostModel.default(), res, 1e-5, bad)
    from distlab.bench.emulate import rate_bits

    with pytest.raises(LaunchError, match="moves nothing"):
        rate_bits("0mbit")
    with pytest.raises(LaunchError, match="not a tc rate"):
        rate_bits("-5mbit")


def test_a_stateful_optimizer_changes_every_row_of_a_sparse_table_each_step():
    class Rec(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.EmbeddingBag(20000, 32, mode="sum", sparse=True)
            self.head = nn.Linear(32, 2)

        def forward(self, ids):
            return self.head(self.table(ids))

    ids = torch.randint(0, 20000, (32, 8), generator=torch.Generator().manual_seed(0))
    prof = dl.profile(Rec(), sample_input=ids, batch_size=32)
    res = hosts()
    cm = CostModel.default()
    st = dl.strategy.build("PS", prof, res, batch_size=32)
    sgd, adam = cm.predict(prof, res, st, optimizer="sgd"), cm.predict(prof, res, st, optimizer="adam")
    table = 20000 * 32 * 4
    # plain SGD: the rows this step touched; Adam: every row with state, in a steady state the table
    assert adam.detail["broadcast"] > table / LINK > 4 * sgd.detail["broadcast"]
    assert adam.breakdown["optimizer"] > 4 * sgd.breakdown["optimizer"]
    c = cm.compile(prof, st)
    assert c.opt_bytes_state >= table > c.opt_bytes and np.all(c.values_link_state >= c.values_link)


def test_calibrations_training_loop_stays_on_the_first_host_and_keeps_a_peer():
    from distlab.calibration.campaign import _reference_worlds

    assert _reference_worlds(hosts((4,))) == [1, 2, 3, 4]  # one host: as before
    assert _reference_worlds(hosts((2, 2))) == [1, 2]  # the link is priced from its own rows
    assert _reference_worlds(hosts((3, 1))) == [1, 2, 3]
    assert _reference_worlds(hosts((1, 1))) == [1, 2]  # a peer across the link, none at home
