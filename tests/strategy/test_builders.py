"""Each builder's placement, sharding and grouping rules on small synthetic profiles."""

from __future__ import annotations

import pytest

import distlab as dl
from distlab import ResourceSpec
from distlab.errors import StrategyError
from distlab.strategy import validate


def servers_of(s):
    """Per variable: its server, or the tuple of its shards' servers."""
    out = []
    for p in s.variables:
        out.append(tuple(x.server for x in p.shards) if p.partition else p.sync.server)
    return out


def groups_of(s):
    return [tuple(x.group for x in p.syncs) if p.partition else p.sync.group for p in s.variables]


@pytest.mark.parametrize("name", dl.strategy.builders())
def test_every_builder_covers_each_variable_once_and_validates(name, recsys, resources):
    s = dl.strategy.build(name, recsys, resources)
    assert [p.name for p in s.variables] == [v.name for v in recsys.variables]
    assert s.builder == name and s.options == {}
    assert s.ranks == resources.ranks
    assert s.batch.per_replica == recsys.batch_size
    validate(s, recsys, resources)
    assert dl.Strategy.from_json(s.to_json(), recsys) == s


def test_default_servers_are_first_rank_of_each_host(mlp, one_node, two_nodes):
    assert dl.strategy.build("PSLoadBalancing", mlp, one_node).servers == (0,)
    assert dl.strategy.build("PSLoadBalancing", mlp, two_nodes).servers == (0, 2)
    assert dl.strategy.build("PSLoadBalancing", mlp, two_nodes, servers="all").servers == (0, 1, 2, 3)


def test_ps_puts_everything_on_the_first_server(mlp, two_nodes):
    s = dl.strategy.build("PS", mlp, two_nodes)
    assert servers_of(s) == [0] * 5
    assert s.servers == (0,)


def test_ps_load_balancing_picks_least_loaded_earlier_on_ties(mlp, one_node, two_nodes):
    # bytes in order: 8192, 256, 3840, 4, 4
    assert servers_of(dl.strategy.build("PSLoadBalancing", mlp, two_nodes)) == [0, 2, 2, 2, 2]
    assert servers_of(dl.strategy.build("PSLoadBalancing", mlp, one_node)) == [0] * 5
    assert servers_of(dl.strategy.build("PSLoadBalancing", mlp, one_node, servers="all")) == [0, 1, 1, 1, 1]
    assert servers_of(dl.strategy.build("PSLoadBalancing", mlp, two_nodes, servers=[3, 1])) == [3, 1, 1, 1, 1]


def test_partitioned_ps_shards_by_smallest_divisor_and_spreads_by_load(mlp, two_nodes):
    s = dl.strategy.build("PartitionedPS", mlp, two_nodes)
    parts = [(p.partition.axis, p.partition.shards) if p.partition else None for p in s.variables]
    assert parts == [(0, 2), (0, 2), (0, 3), None, None]  # 64 -> 2, 64 -> 2, 15 -> 3, dim 1, scalar
    # fc1.weight 4096+4096, fc1.bias 128+128 (tie: stable order), fc2.weight 3 x 1280 round-robin
    # (loads 6784 vs 5504 after it), then the unsplit ones to the least-loaded server 2
    assert servers_of(s) == [(0, 2), (0, 2), (0, 2, 0), 2, 2]


def test_partitioned_ps_prime_dimension_gives_that_many_shards(one_node):
    prof = dl.ModelProfile.from_variables([("w", (7, 3))])
    s = dl.strategy.build("PartitionedPS", prof, one_node, servers="all")
    assert s.variables[0].partition.shards == 7
    assert servers_of(s) == [(0, 1, 0, 1, 0, 1, 0)]


def test_uneven_partitioned_ps_uses_smallest_non_divisor(mlp, two_nodes):
    s = dl.strategy.build("UnevenPartitionedPS", mlp, two_nodes)
    shards = [p.partition.shards if p.partition else 1 for p in s.variables]
    assert shards == [3, 3, 2, 1, 1]  # 64 -> 3, 64 -> 3, 15 -> 2
    # AutoDist's get_num_shards: no non-divisor below dimension 0 -> dimension 0 itself
    # (2 splits in two, 1 stays whole)
    two = dl.ModelProfile.from_variables([("w", (2, 5)), ("u", (1, 5))])
    built = dl.strategy.build("UnevenPartitionedPS", two, two_nodes).variables
    assert built[0].partition.shards == 2 and built[1].partition is None


def test_uneven_partitioned_ps_places_shards_as_autodist_does(two_nodes):
    # AutoDist's UnevenPartitionedPS: servers sorted by load once per variable (ties in server
    # order), shards round-robin over them, each charging the variable's bytes / shards. Two
    # scalars first: a -> 0, b -> 2 (4 bytes each); w (5 x 4, 80 B, 2 shards of 3 and 2 rows)
    # charges 40 + 40, a tie again, so v (7 x 2, 2 shards) starts on server 0 as well. Charging
    # w's real shard sizes (48 + 32) would have started v on server 2.
    prof = dl.ModelProfile.from_variables([("a", ()), ("b", ()), ("w", (5, 4)), ("v", (7, 2))])
    s = dl.strategy.build("UnevenPartitionedPS", prof, two_nodes)
    assert [p.partition.shards if p.partition else 1 for p in s.variables] == [1, 1, 2, 2]
    assert servers_of(s) == [0, 2, (0, 2), (0, 2)]


def _autodist_uneven(variables, servers):
    """AutoDist's UnevenPartitionedPS placement, as its builder states it: shards = the smallest
    i in [2, n) not dividing dimension 0 (n when none; 1 for a scalar); servers sorted by load once
    per variable (ties in server order), repeated round-robin when shards outnumber them, each
    shard charging the variable's bytes / shards."""
    import math

    loads = {s: 0.0 for s in servers}
    out = []
    for shape, nbytes in variables:
        k = 1 if not shape else next((i for i in range(2, shape[0]) if shape[0] % i), shape[0])
        order = sorted(loads, key=loads.get)
        order = order * math.ceil(k / len(order))
        for ps in order[:k]:
            loads[ps] += nbytes / k
        out.append(order[0] if k == 1 else tuple(order[:k]))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_uneven_partitioned_ps_matches_autodist_on_random_models(seed, two_nodes):
    import math
    import random

    rng = random.Random(seed)
    shapes = [(), ()] + [(rng.randint(1, 12), rng.randint(1, 6)) for _ in range(rng.randint(1, 6))]
    prof = dl.ModelProfile.from_variables([(f"v{i}", s) for i, s in enumerate(shapes)])
    s = dl.strategy.build("UnevenPartitionedPS", prof, two_nodes)
    expected = _autodist_uneven([(sh, 4 * math.prod(sh)) for sh in shapes], list(s.servers))
    assert servers_of(s) == expected, shapes


def test_allreduce_groups_by_index_and_allgathers_sparse(mlp, recsys, one_node):
    s = dl.strategy.build("AllReduce", mlp, one_node, chunk_size=2)
    assert groups_of(s) == [0, 0, 1, 1, 2]
    assert {p.sync.kind for p in s.variables} == {"allreduce"}
    assert s.options == {"chunk_size": 2} and s.name == "AllReduce(chunk_size=2)"
    r = dl.strategy.build("AllReduce", recsys, one_node, compressor="fp16")
    assert [p.sync.kind for p in r.variables] == ["allgather", "allreduce", "allreduce", "allreduce"]
    assert {p.sync.compressor for p in r.variables[1:]} == {"fp16"}
    assert r.servers == ()


def test_partitioned_ar_groups_by_running_shard_counter(mlp, one_node):
    s = dl.strategy.build("PartitionedAR", mlp, one_node, chunk_size=2)
    assert [p.partition.shards if p.partition else 1 for p in s.variables] == [2, 2, 3, 1, 1]
    # shard counter 0..8 -> groups counter // 2
    assert groups_of(s) == [(0, 0), (1, 1), (2, 2, 3), 3, 4]


def test_random_axis_partition_ar_is_seeded_and_follows_axis_rules(one_node):
    prof = dl.ModelProfile.from_variables(
        [("emb", (10, 6), "float32", True)] + [(f"w{i}", (4, 9, 1)) for i in range(12)]
    )
    a = dl.strategy.build("RandomAxisPartitionAR", prof, one_node, seed=3)
    assert a == dl.strategy.build("RandomAxisPartitionAR", prof, one_node, seed=3)
    emb = a.variables[0]
    assert (emb.partition.axis, emb.partition.shards) == (0, 2)
    assert {s.kind for s in emb.shards} == {"allgather"}
    axes = [p.partition.axis for p in a.variables[1:]]
    assert set(axes) <= {0, 1}  # never the size-1 axis 2
    for p in a.variables[1:]:
        assert p.partition.shards == {0: 2, 1: 3}[p.partition.axis]
    others = [dl.strategy.build("RandomAxisPartitionAR", prof, one_node, seed=s) for s in range(4, 8)]
    assert any(o.variables != a.variables for o in others)
    assert a.options == {"seed": 3}


def test_parallax_ps_for_embeddings_allreduce_for_dense(recsys, two_nodes):
    s = dl.strategy.build("Parallax", recsys, two_nodes, chunk_size=1)
    assert [p.sync.kind for p in s.variables] == ["ps", "ps", "allreduce", "allreduce"]
    assert servers_of(s)[:2] == [0, 2]  # load-balanced over the two hosts' first ranks
    assert groups_of(s)[2:] == [2, 3]  # index over all variables
    assert s.servers == (0, 2)


def test_gossip_options(recsys, two_nodes):
    s = dl.strategy.build("Gossip", recsys, two_nodes)
    assert [p.sync.kind for p in s.variables] == ["allgather", "gossip", "gossip", "gossip"]
    assert (s.gossip.topology, s.gossip.dynamic, s.gossip.mode) == ("exp2", False, "atc")
    ps = dl.strategy.build("Gossip", recsys, two_nodes, sparse="ps", mode="awc")
    assert [p.sync.kind for p in ps.variables] == ["ps", "ps", "gossip", "gossip"]
    assert servers_of(ps)[:2] == [0, 2] and ps.gossip.mode == "awc"
    dyn = dl.strategy.build("Gossip", recsys, two_nodes, topology="one_peer_exp2")
    assert dyn.gossip.dynamic is True
    hier = dl.strategy.build("Gossip", recsys, two_nodes, topology="hierarchical")
    assert dl.strategy.execution.for_strategy(hier).period == 2


def test_gossip_refuses_one_rank(recsys):
    with pytest.raises(StrategyError, match="at least 2 ranks"):
        dl.strategy.build("Gossip", recsys, ResourceSpec.local(workers=1))


def test_gossip_refuses_topology_that_does_not_fit(recsys, two_nodes):
    with pytest.raises(StrategyError, match="topology"):  # BlueFog's inner-outer needs 3+ ranks per host
        dl.strategy.build("Gossip", recsys, two_nodes, topology="inner_outer_ring")
    with pytest.raises(StrategyError, match="not known"):
        dl.strategy.build("Gossip", recsys, two_nodes, topology="torus")


def test_adaptive_batch_wraps_a_base_builder(mlp, two_nodes):
    s = dl.strategy.build("AdaptiveBatch", mlp, two_nodes)
    assert s.batch.lr_scaling == "adascale" and s.builder == "AdaptiveBatch"
    assert s.variables == dl.strategy.build("AllReduce", mlp, two_nodes).variables
    p = dl.strategy.build(
        "AdaptiveBatch", mlp, two_nodes, base="PS", lr_scaling="sqrt", servers="all", batch_size=8
    )
    assert p.variables == dl.strategy.build("PS", mlp, two_nodes).variables
    assert p.batch.per_replica == 8 and p.batch.lr_scaling == "sqrt"
    assert p.options == {"base": "PS", "lr_scaling": "sqrt", "servers": "all", "batch_size": 8}
    with pytest.raises(StrategyError, match="PS: unknown option 'chunk_size'"):
        dl.strategy.build("AdaptiveBatch", mlp, two_nodes, base="PS", chunk_size=3)


def test_batch_size_option(mlp, one_node):
    s = dl.strategy.build("PS", mlp, one_node, batch_size=8)
    assert s.batch.per_replica == 8 and s.options == {"batch_size": 8}
    assert dl.strategy.build("PS", mlp, one_node, batch_size=mlp.batch_size).options == {}
    with pytest.raises(StrategyError, match="batch_size"):
        dl.strategy.build("PS", mlp, one_node, batch_size=0)


def test_unknown_builder_and_option_list_the_valid_ones(mlp, one_node):
    with pytest.raises(StrategyError, match="PSLoadBalancing, PartitionedPS"):
        dl.strategy.build("Horovod", mlp, one_node)
    with pytest.raises(
        StrategyError, match=r"AllReduce: unknown option 'chunk'; valid options: chunk_size, compressor"
    ):
        dl.strategy.build("AllReduce", mlp, one_node, chunk=4)
    with pytest.raises(StrategyError, match="compressor 'int8'"):
        dl.strategy.build("AllReduce", mlp, one_node, compressor="int8")
    with pytest.raises(StrategyError, match="servers: rank 9 does not exist"):
        dl.strategy.build("PS", mlp, one_node, servers=[9])


def test_builders_are_deterministic(recsys, two_nodes):
    for name in dl.strategy.builders():
        assert (
            dl.strategy.build(name, recsys, two_nodes).to_json()
            == dl.strategy.build(name, recsys, two_nodes).to_json()
        )
