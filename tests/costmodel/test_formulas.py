"""Each cost formula against a hand computation (Thakur et al. 2005 alpha-beta costs)."""

from __future__ import annotations

import math

import pytest

from distlab.costmodel.collectives import collective_time
from distlab.costmodel.compile import compile_strategy
from distlab.errors import DistlabError
from distlab.strategy.types import BatchConfig, GossipConfig, Partition, Strategy, Sync, VariablePlan

from .toys import ALPHA, BETA, allreduce, exact_model, plan, toy_profile, toy_resources


@pytest.mark.parametrize(
    "coll,p,n,expected",
    [
        ("allreduce", 4, 1000, 2 * 3 * ALPHA + 2 * 3 / 4 * 1000 * BETA),
        ("allreduce", 2, 1000, 2 * ALPHA + 1000 * BETA),
        ("reduce", 8, 1000, 3 * (ALPHA + 1000 * BETA)),
        ("broadcast", 5, 1000, 3 * (ALPHA + 1000 * BETA)),
        ("allgather", 4, 1000, 3 * ALPHA + 3 * 1000 * BETA),
        ("sendrecv", 4, 1000, ALPHA + 1000 * BETA),
        ("allreduce", 1, 1000, 0.0),
    ],
)
def test_collective_times_match_thakur(coll, p, n, expected):
    assert float(collective_time(coll, p, n, ALPHA, BETA)) == pytest.approx(expected)


def test_single_bucket_allreduce_is_fully_exposed_ring_cost():
    prof = toy_profile()
    res = toy_resources(4)
    pred = exact_model().predict(prof, res, plan(prof, allreduce(0, 0, 0), res))
    n = 4 * 4000
    assert pred.breakdown["comm"] == pytest.approx(6 * ALPHA + 1.5 * n * BETA)
    assert pred.breakdown["compute"] == pytest.approx(3 * 0.005 + 3 * 0.010)
    assert pred.step_time == pytest.approx(sum(pred.breakdown.values()))
    assert pred.throughput == pytest.approx(4 * 32 / pred.step_time)


def test_bucket_copies_and_divisions_are_charged_as_the_runtime_makes_them():
    # v0..v2 in one group: one bucket of 16000 bytes flattened by torch.cat, then divided by the
    # world in place (two passes); in three groups each variable is its own bucket, reduced in
    # place but still divided (one pass); one rank launches no bucket at all
    prof = toy_profile()
    res = toy_resources(4)
    cm, free = exact_model(copy_per_byte=1e-9), exact_model()
    one = plan(prof, allreduce(0, 0, 0), res)
    three = plan(prof, allreduce(0, 1, 2), res)
    assert cm.compile(prof, one).copy_bytes == 2 * 4 * 4000
    assert cm.compile(prof, three).copy_bytes == 4 * 4000
    gap = cm.predict(prof, res, one).step_time - free.predict(prof, res, one).step_time
    assert gap == pytest.approx(2 * 4 * 4000 * 1e-9)
    gap = cm.predict(prof, res, three).step_time - free.predict(prof, res, three).step_time
    assert gap == pytest.approx(4 * 4000 * 1e-9)
    res1 = toy_resources(1)
    assert cm.compile(prof, plan(prof, allreduce(0, 0, 0), res1)).copy_bytes == 0


def test_world_of_one_has_no_communication():
    prof = toy_profile()
    res = toy_resources(1)
    pred = exact_model().predict(prof, res, plan(prof, allreduce(0, 1, 2), res))
    assert pred.breakdown["comm"] == 0.0
    assert pred.throughput == pytest.approx(32 / 0.045)


def test_inter_host_link_is_used_when_ranks_span_hosts():
    prof = toy_profile()
    cm = exact_model()
    cm.params.alpha_beta["allreduce/inter"] = (ALPHA, 10 * BETA)  # a 10x slower network
    one = cm.predict(
        prof, toy_resources(4, hosts=1), plan(prof, allreduce(0, 0, 0), toy_resources(4, hosts=1))
    )
    two = cm.predict(
        prof, toy_resources(4, hosts=2), plan(prof, allreduce(0, 0, 0), toy_resources(4, hosts=2))
    )
    n = 16000
    assert two.breakdown["comm"] - 6 * ALPHA == pytest.approx(10 * (one.breakdown["comm"] - 6 * ALPHA))
    assert two.breakdown["comm"] == pytest.approx(6 * ALPHA + 1.5 * n * 10 * BETA)


def test_uncalibrated_model_follows_resource_spec_links():
    from distlab.costmodel import CostModel
    from distlab.resources import Link, ResourceSpec

    prof = toy_profile()
    base = toy_resources(2)
    res = ResourceSpec(base.ranks, links={"intra": Link(1e-3, 1e6), "inter": Link(1e-3, 1e6)})
    cm = CostModel.default()
    pred = cm.predict(prof, res, plan(prof, allreduce(0, 0, 0), res))
    # the one bucket's flatten and its division by the world at the default's figure, slowed as
    # the optimizer is (2 busy ranks)
    copies = 2 * 16000 * cm.params.copy_per_byte * (1 + cm.params.contention)
    assert pred.breakdown["comm"] == pytest.approx(2 * 1e-3 + 16000 / 1e6 + copies)


def test_fp16_compressor_halves_the_bandwidth_term():
    prof = toy_profile()
    res = toy_resources(4)
    cm = exact_model()
    plain = cm.predict(prof, res, plan(prof, allreduce(0, 0, 0), res)).breakdown["comm"]
    half = cm.predict(prof, res, plan(prof, allreduce(0, 0, 0, compressor="fp16"), res)).breakdown["comm"]
    assert plain - 6 * ALPHA == pytest.approx(2 * (half - 6 * ALPHA))


def test_parameter_servers_reduce_in_backward_and_busiest_server_bounds_broadcast():
    prof = toy_profile(sizes=(1000, 1000, 2000))  # 4000, 4000, 8000 bytes, ready at 30, 20, 10 ms
    res = toy_resources(2)
    cm = exact_model()
    # server 0: v0+v1 (2 calls, 8000 B); server 1: v2 (1 call, 8000 B); log2(2) = 1 tree round
    balanced = cm.predict(
        prof, res, plan(prof, [Sync("ps", server=0), Sync("ps", server=0), Sync("ps", server=1)], res)
    )
    # reduces overlap backward: only v0's (ready last) shows
    assert balanced.detail["backward"] == pytest.approx(ALPHA + 4000 * BETA)
    assert balanced.detail["broadcast"] == pytest.approx(2 * ALPHA + 8000 * BETA)
    single = cm.predict(prof, res, plan(prof, [Sync("ps", server=0)] * 3, res))
    assert single.detail["broadcast"] == pytest.approx(3 * ALPHA + 16000 * BETA)
    assert balanced.throughput > single.throughput
    # four ranks: a binomial tree has ceil(log2 4) = 2 rounds
    res4 = toy_resources(4)
    four = cm.predict(prof, res4, plan(prof, [Sync("ps", server=0)] * 3, res4))
    assert four.detail["broadcast"] == pytest.approx(2 * (3 * ALPHA + 16000 * BETA))
    assert four.detail["backward"] == pytest.approx(2 * (ALPHA + 4000 * BETA))


def test_receiving_from_every_other_server_can_bound_the_broadcast():
    prof = toy_profile(sizes=(1000, 1000, 1000, 1000), bwd=(0.01,) * 4)
    res = toy_resources(4)
    # 4 servers of 4000 B: each server's tree costs 2 * 4000 beta, but every rank receives 12000 B
    pred = exact_model(alpha=0.0).predict(
        prof, res, plan(prof, [Sync("ps", server=r) for r in range(4)], res)
    )
    assert pred.detail["broadcast"] == pytest.approx(12000 * BETA)


def test_optimizer_time_counts_only_a_servers_share():
    prof = toy_profile(sizes=(1000, 1000, 2000))
    res = toy_resources(2)
    cm = exact_model(optimizer_per_byte=1e-9)
    ar = cm.predict(prof, res, plan(prof, allreduce(0, 0, 0), res)).breakdown["optimizer"]
    ps = cm.predict(
        prof, res, plan(prof, [Sync("ps", server=0), Sync("ps", server=0), Sync("ps", server=1)], res)
    )
    assert ar == pytest.approx(16000 * 1e-9)
    assert ps.breakdown["optimizer"] == pytest.approx(8000 * 1e-9)


def test_the_optimizer_that_runs_is_priced_by_its_work_per_byte():
    prof = toy_profile(sizes=(1000, 1000, 2000))
    res = toy_resources(2)
    cm = exact_model(optimizer_per_byte=1e-9, adam_work=3.5, momentum_work=1.8)
    st = plan(prof, allreduce(0, 0, 0), res)
    sgd = cm.predict(prof, res, st, optimizer="sgd")
    assert sgd.breakdown["optimizer"] == pytest.approx(16000 * 1e-9)
    assert cm.predict(prof, res, st, optimizer="rmsprop").breakdown["optimizer"] == pytest.approx(
        1.8 * 16000e-9
    )
    adam = cm.predict(prof, res, st, optimizer="adamw")
    assert adam.breakdown["optimizer"] == pytest.approx(3.5 * 16000e-9)
    assert adam.step_time == pytest.approx(sgd.step_time + 2.5 * 16000e-9)
    # no optimizer named: the launch's default, Adam
    assert cm.predict(prof, res, st).step_time == adam.step_time
    table = cm.rank(prof, res, [st], optimizer="sgd")
    assert table["optimizer"].iloc[0] == pytest.approx(16000 * 1e-9)
    with pytest.raises(DistlabError, match="optimizer: 'lamb' is not one the cost model prices"):
        cm.predict(prof, res, st, optimizer="lamb")


def test_sparse_allgather_grows_linearly_with_touched_rows_and_world():
    from distlab.profiling.model_profile import ModelProfile, VariableProfile

    emb = VariableProfile(
        "emb", (1000, 16), "float32", 64000, sparse=True, embedding=True, layer="emb", touched_rows=100
    )
    prof = ModelProfile((emb,), batch_size=32, step_time=0.01)
    cm = exact_model()
    for p in (2, 4, 8):
        res = toy_resources(p)
        pred = cm.predict(prof, res, plan(prof, [Sync("allgather")], res))
        assert pred.detail["sparse"] == pytest.approx((p - 1) * (3 * ALPHA + 100 * (64 + 8) * BETA))
    # without a measured count: batch x fields (ids per sample) rows
    est = ModelProfile(
        (VariableProfile("emb", (1000, 16), "float32", 64000, sparse=True, embedding=True),),
        batch_size=32,
        step_time=0.01,
        input_spec={"shape": [5], "dtype": "int64"},
    )
    res = toy_resources(2)
    assert cm.predict(est, res, plan(est, [Sync("allgather")], res)).detail["sparse"] == pytest.approx(
        3 * ALPHA + 160 * 72 * BETA
    )


def test_allgather_of_a_dense_variable_runs_as_an_allreduce_bucket():
    prof = toy_profile()
    res = toy_resources(4)
    cm = exact_model()
    dense = cm.predict(prof, res, plan(prof, [Sync("allgather")] * 3, res))
    assert dense.breakdown["comm"] == pytest.approx(
        cm.predict(prof, res, plan(prof, allreduce(0, 0, 0), res)).breakdown["comm"]
    )


@pytest.mark.parametrize("world,degree", [(2, 1), (4, 2), (8, 3), (9, 4)])
def test_gossip_exp2_costs_in_degree_messages(world, degree):
    prof = toy_profile()
    res = toy_resources(world)
    s = plan(prof, [Sync("gossip")] * 3, res, gossip=GossipConfig("exp2", dynamic=False, mode="atc"))
    pred = exact_model().predict(prof, res, s)
    assert degree == int(math.floor(math.log2(world - 1))) + 1
    assert pred.breakdown["comm"] == pytest.approx(
        degree * (ALPHA + 16000 * BETA)
    )  # one flat message per neighbour


def test_one_peer_gossip_is_one_message_and_awc_hides_behind_the_optimizer_step():
    prof = toy_profile()
    res = toy_resources(8)
    one_peer = GossipConfig("exp2", dynamic=True, mode="atc")
    one = exact_model().predict(prof, res, plan(prof, [Sync("gossip")] * 3, res, gossip=one_peer))
    assert one.breakdown["comm"] == pytest.approx(ALPHA + 16000 * BETA)
    awc = GossipConfig("exp2", dynamic=True, mode="awc")
    # the optimizer step takes 16000 B * 100 ns = 1.6 ms: 0.26 ms of gossip hides inside it
    cm = exact_model(optimizer_per_byte=1e-7)
    assert cm.predict(prof, res, plan(prof, [Sync("gossip")] * 3, res, gossip=awc)).breakdown["comm"] == 0.0
    # 160 ms of gossip: only what outlasts the step shows; ATC shows all of it
    slow = exact_model(beta=1e-5, optimizer_per_byte=1e-7)
    awc_slow = slow.predict(prof, res, plan(prof, [Sync("gossip")] * 3, res, gossip=awc))
    assert awc_slow.breakdown["comm"] == pytest.approx(ALPHA + 16000 * 1e-5 - 16000 * 1e-7)
    atc_slow = slow.predict(prof, res, plan(prof, [Sync("gossip")] * 3, res, gossip=one_peer))
    assert atc_slow.breakdown["comm"] == pytest.approx(ALPHA + 16000 * 1e-5)


def test_partitioned_variable_shards_go_to_their_servers():
    prof = toy_profile(sizes=(1000, 1000, 2000))
    res = toy_resources(2)
    vs = (
        VariablePlan("v0", Sync("ps", server=0)),
        VariablePlan("v1", Sync("ps", server=1)),
        VariablePlan("v2", partition=Partition(0, 2), shards=(Sync("ps", server=0), Sync("ps", server=1))),
    )
    from distlab.strategy.types import Strategy

    pred = exact_model().predict(prof, res, Strategy(vs, res.ranks))
    assert pred.detail["broadcast"] == pytest.approx(2 * ALPHA + 8000 * BETA)  # each server: 2 calls, 8000 B
    assert pred.detail["backward"] == pytest.approx(ALPHA + 4000 * BETA)  # v0's reduce, after backward


def test_batch_scales_compute_linearly_and_accumulation_amortises_comm():
    prof = toy_profile()
    res = toy_resources(2)
    cm = exact_model()
    base = cm.predict(prof, res, plan(prof, allreduce(0, 0, 0), res))
    double = cm.predict(prof, res, plan(prof, allreduce(0, 0, 0), res, per_replica=64))
    assert double.breakdown["compute"] == pytest.approx(2 * base.breakdown["compute"])
    acc = cm.predict(prof, res, plan(prof, allreduce(0, 0, 0), res, accum=4))
    assert acc.breakdown["compute"] == pytest.approx(4 * base.breakdown["compute"])
    assert acc.breakdown["comm"] == pytest.approx(base.breakdown["comm"])
    assert acc.throughput == pytest.approx(4 * 32 * 2 / acc.step_time)
    assert acc.throughput > base.throughput


def test_ddp_buckets_ignore_group_ids_like_the_runtime():
    prof = toy_profile(sizes=(100_000, 200_000, 300_000))  # 0.4, 0.8, 1.2 MB; ready at 30, 20, 10 ms
    res = toy_resources(2)
    s = plan(prof, allreduce(0, 1, 2), res)
    by_group = exact_model(beta=1e-7).compile(prof, s)
    assert list(by_group.task_ar_bytes) == [1.2e6, 0.8e6, 0.4e6]
    ddp = exact_model(beta=1e-7, ddp=True).compile(prof, s)
    # DDP: a 1 MiB first bucket (v2 alone, 1.2 MB overflows it on its own), then up to 25 MiB
    assert list(ddp.task_ar_bytes) == [1.2e6, 1.2e6]
    capped = exact_model(bucket_bytes=2 * 2**20).compile(prof, plan(prof, allreduce(0, 0, 0), res))
    assert list(capped.task_ar_bytes) == [2.0e6, 0.4e6]  # one group split at the 2 MiB cap


def test_training_loop_overhead_adds_per_step_per_rank_and_per_tensor():
    prof = toy_profile()  # 3 tensors, fwd 3 x 5 ms + bwd 3 x 10 ms
    res = toy_resources(2)
    s = plan(prof, allreduce(0, 1, 2), res)
    base = exact_model().predict(prof, res, s)
    loaded = exact_model(
        step_overhead=1e-3,
        rank_overhead=2e-3,
        tensor_overhead=1e-4,
        runtime_overhead=4e-4,
        hook_overhead=2e-4,
    ).predict(prof, res, s)
    # 1 ms + 0.4 ms + 2 ms x (2 - 1) ranks + (0.1 + 0.2) ms x 3 tensors, all on the compute side
    assert loaded.breakdown["compute"] - base.breakdown["compute"] == pytest.approx(4.3e-3)
    assert loaded.breakdown["comm"] == pytest.approx(base.breakdown["comm"])
    assert loaded.step_time - base.step_time == pytest.approx(4.3e-3)


def test_a_sparse_gradient_updates_only_the_rows_it_holds_and_a_stateful_optimizer_every_row_with_state():
    from distlab.profiling.model_profile import ModelProfile, VariableProfile

    emb = VariableProfile(
        "emb", (1000, 16), "float32", 64000, sparse=True, embedding=True, layer="emb", touched_rows=100
    )
    prof = ModelProfile((emb,), batch_size=32, step_time=0.01)
    cm = exact_model(optimizer_per_byte=1e-9)
    for p, rows in ((2, 200), (4, 400), (16, 1000)):  # union of the ranks' rows, at most the table
        res = toy_resources(p)
        for sync in (Sync("allgather"), Sync("ps", server=0)):
            st = plan(prof, [sync], res)
            assert cm.predict(prof, res, st, optimizer="sgd").breakdown["optimizer"] == pytest.approx(
                rows * 64 * 1e-9
            )
            # momentum or Adam (the launch default, densifying): every row with state changes each
            # step, in a steady state the whole table (runtime/ps.py _changed_rows,
            # keras_optim.KerasOptimizer)
            work = cm.params.momentum_work
            assert cm.predict(prof, res, st, optimizer="momentum").breakdown["optimizer"] == pytest.approx(
                1000 * 64 * 1e-9 * work
            )


def test_every_collective_call_costs_the_runtime_and_one_rank_calls_none():
    prof = toy_profile(sizes=(1000, 1000, 2000))
    for world, expected in ((1, 0.0), (2, 6e-4)):
        res = toy_resources(world)
        ps = plan(prof, [Sync("ps", server=0), Sync("ps", server=0), Sync("ps", server=1 % world)], res)
        base = exact_model().predict(prof, res, ps)
        calls = exact_model(call_overhead=1e-4).predict(prof, res, ps)
        # 3 reduces in backward + 3 broadcasts after the step (one per dense variable); one rank
        # is every server and keeps its own gradients: the runtime calls nothing (runtime/ps.py)
        assert calls.breakdown["comm"] - base.breakdown["comm"] == pytest.approx(expected)
        assert calls.detail["calls"] == pytest.approx(expected)


def test_calls_wait_longer_for_peers_when_ranks_take_turns_on_the_cores():
    prof = toy_profile(sizes=(1000, 1000, 2000))
    base = exact_model()
    waits = exact_model(peer_call_overhead=1e-4)
    for world, cores, sliced in ((2, 2, 1.0), (4, 2, 2.0), (4, 4, 1.0)):
        res = toy_resources(world, cores=cores)
        s = plan(prof, allreduce(0, 0, 0), res)  # one bucket: one call
        extra = waits.predict(prof, res, s).breakdown["comm"] - base.predict(prof, res, s).breakdown["comm"]
        assert extra == pytest.approx(1e-4 * (world - 1) * sliced)


def test_gossip_pays_local_work_per_byte_tensor_and_neighbour():
    prof = toy_profile()
    res = toy_resources(5)  # exp2 on 5 ranks: 3 in-neighbours (1, 2, 4 hops)
    s = plan(prof, [Sync("gossip")] * 3, res, gossip=GossipConfig("exp2", dynamic=False, mode="atc"))
    pred = exact_model(gossip_per_byte=1e-9, gossip_tensor_overhead=1e-5).predict(prof, res, s)
    assert pred.breakdown["comm"] == pytest.approx(3 * (ALPHA + 16000 * (BETA + 1e-9) + 3 * 1e-5))


@pytest.mark.parametrize("cores", [None, 2])
@pytest.mark.parametrize("mode,passes", [("atc", 3 + 1.5 * 3), ("awc", 6 + 1.5 * 3)])
def test_gossip_passes_over_its_bytes_cost_copies(mode, passes, cores):
    # runtime/gossip.py: flatten, weigh, write back (AWC: also re-flatten and apply the local
    # update), and an add per in-neighbour, each a pass over the 16000 gossiped bytes; on bytes
    # the step has just written (in cache), so not slowed as the optimizer's cold bytes are, even
    # with 5 ranks on 2 cores
    prof = toy_profile()
    res = toy_resources(5, cores=cores)  # exp2 on 5 ranks: 3 in-neighbours
    s = plan(prof, [Sync("gossip")] * 3, res, gossip=GossipConfig("exp2", dynamic=False, mode=mode))
    slowed = exact_model(contention=0.5)
    extra = (
        exact_model(contention=0.5, copy_per_byte=1e-9).predict(prof, res, s).step_time
        - slowed.predict(prof, res, s).step_time
    )
    assert extra == pytest.approx(passes * 16000 * 1e-9)
    if cores:  # the optimizer on the same host is slowed: the passes' figure is not by accident
        opt = (
            exact_model(contention=0.5, optimizer_per_byte=1e-9).predict(prof, res, s).breakdown["optimizer"]
        )
        assert opt > 1.5 * 16000 * 1e-9


def test_sparse_gathers_wait_for_peers_on_their_own_figure():
    from distlab.profiling.model_profile import ModelProfile, VariableProfile

    emb = VariableProfile(
        "emb", (1000, 16), "float32", 64000, sparse=True, embedding=True, layer="emb", touched_rows=100
    )
    prof = ModelProfile((emb,), batch_size=32, step_time=0.01)
    res = toy_resources(4, cores=2)  # 4 ranks take turns on 2 cores
    s = plan(prof, [Sync("allgather")], res)
    base = exact_model().predict(prof, res, s)
    waits = exact_model(gather_peer_overhead=1e-4).predict(prof, res, s)
    # 3 calls (sizes, indices, values) x 3 peers x 2 ranks per core
    assert waits.breakdown["comm"] - base.breakdown["comm"] == pytest.approx(3 * 3 * 2 * 1e-4)
    # the PS path's gather of rows to its server: counts, then indices and values, the same figure;
    # its broadcast of changed rows after the server's step does not pay it
    ps = plan(prof, [Sync("ps", server=1)], res)
    assert compile_strategy(prof, ps).sps_gather_calls == 3
    base = exact_model().predict(prof, res, ps)
    waits = exact_model(gather_peer_overhead=1e-4).predict(prof, res, ps)
    assert waits.breakdown["comm"] - base.breakdown["comm"] == pytest.approx(3 * 3 * 2 * 1e-4)


def sparse_tables(n: int):
    """A profile of ``n`` sparse 1000 x 16 embedding tables, 100 rows touched per step each."""
    from distlab.profiling.model_profile import ModelProfile, VariableProfile

    tables = tuple(
        VariableProfile(
            f"emb{i}",
            (1000, 16),
            "float32",
            64000,
            sparse=True,
            embedding=True,
            layer=f"emb{i}",
            touched_rows=100,
        )
        for i in range(n)
    )
    return ModelProfile(tables, batch_size=32, step_time=0.01), tables


def test_sparse_path_work_is_per_table_or_shard_on_any_world_size():
    prof, tables = sparse_tables(2)
    for world in (1, 4):
        res = toy_resources(world, cores=2)
        for syncs, units in (([Sync("allgather")] * 2, 2), ([Sync("ps", server=0)] * 2, 2)):
            s = plan(prof, syncs, res)
            extra = exact_model(sparse_unit_overhead=1e-4).predict(prof, res, s).breakdown["comm"]
            extra -= exact_model().predict(prof, res, s).breakdown["comm"]
            # coalescing, packing and unpacking each table's rows: one rank does it too
            assert extra == pytest.approx(units * 1e-4)
    res = toy_resources(2)
    split = tuple(
        VariablePlan(t.name, partition=Partition(0, 2), shards=(Sync("ps", server=0), Sync("ps", server=1)))
        for t in tables
    )
    s = Strategy(split, res.ranks, batch=BatchConfig(32, 1), builder="toy")
    assert compile_strategy(prof, s).sparse_units == 4  # two shards per table


def test_ps_units_and_their_copies_are_charged_on_any_world_size():
    # v0 and v1 whole on the PS path, v2 (2000 floats) in two shards: 4 units. Every rank divides
    # each gradient into a fresh tensor for its reduce (world > 1: 16000 bytes in all)
    # and writes each shard's new value back into v2 (any world: 8000 bytes)
    prof = toy_profile(sizes=(1000, 1000, 2000))
    vs = (
        VariablePlan("v0", Sync("ps", server=0)),
        VariablePlan("v1", Sync("ps", server=0)),
        VariablePlan("v2", partition=Partition(0, 2), shards=(Sync("ps", server=0), Sync("ps", server=0))),
    )
    for world, copied in ((1, 8000), (2, 16000 + 8000)):
        res = toy_resources(world, cores=2)
        s = Strategy(vs, res.ranks, batch=BatchConfig(32, 1), builder="toy")
        c = compile_strategy(prof, s)
        assert (c.ps_units, c.copy_bytes) == (4, copied)
        free = exact_model().predict(prof, res, s).step_time
        per_unit = exact_model(ps_unit_overhead=1e-4).predict(prof, res, s).step_time - free
        per_byte = exact_model(copy_per_byte=1e-9).predict(prof, res, s).step_time - free
        assert (per_unit, per_byte) == (pytest.approx(4e-4), pytest.approx(copied * 1e-9))


def test_sparse_tables_share_one_packed_exchange_per_server():
    prof, tables = sparse_tables(4)
    res = toy_resources(4)
    ag = compile_strategy(prof, plan(prof, [Sync("allgather")] * 4, res))
    assert ag.ag_calls == 3  # one exchange for the four tables (runtime/allgather.py)
    assert ag.ag_bytes == pytest.approx(4 * 100 * (64 + 8))
    ps = compile_strategy(prof, plan(prof, [Sync("ps", server=i % 2) for i in range(4)], res))
    # the counts of all tables in one all-gather, then per server a gather of indices and values;
    # after the step per server a broadcast of counts, rows and values (runtime/ps.py)
    assert (ps.sps_gather_calls, ps.sps_bcast_calls) == (1 + 2 * 2, 3 * 2)


@pytest.mark.parametrize("world,cores,turns", [(2, 2, 0.0), (4, 2, 0.4 * 1), (4, 4, 0.0)])
def test_wire_time_in_training_scales_bytes_and_latency_apart_and_grows_when_ranks_take_turns(
    world, cores, turns
):
    prof = toy_profile()
    res = toy_resources(world, cores=cores)
    s = plan(prof, allreduce(0, 0, 0), res)  # one bucket after backward: fully exposed
    base = exact_model().predict(prof, res, s).breakdown["comm"]
    nbytes = 4 * (1000 + 1000 + 2000)  # toy_profile: its three float32 variables in one bucket
    latency = float(collective_time("allreduce", world, nbytes, ALPHA, 0.0))
    assert base == pytest.approx(float(collective_time("allreduce", world, nbytes, ALPHA, BETA)))
    scaled = exact_model(comm_scale=1.5, alpha_scale=0.5, comm_oversubscription=0.4)
    got = scaled.predict(prof, res, s).breakdown["comm"]
    assert got == pytest.approx((0.5 + turns) * latency + (1.5 + turns) * (base - latency))


def test_an_optimizer_step_costs_per_tensor_as_well_as_per_byte():
    # three tensors, Adam's per-tensor cost 50 us: an all-reduce rank steps all three, a PS server
    # its own (server 0 holds two of them), one process all three; SGD at its own figure
    prof = toy_profile(sizes=(1000, 1000, 2000))
    res = toy_resources(2)
    cm = exact_model(optimizer_per_byte=1e-9, adam_work=3.5, adam_tensor=50e-6, sgd_tensor=2e-6)
    free = exact_model(optimizer_per_byte=1e-9, adam_work=3.5)
    ar = plan(prof, allreduce(0, 0, 0), res)
    ps = plan(prof, [Sync("ps", server=0), Sync("ps", server=0), Sync("ps", server=1)], res)
    for st, tensors in ((ar, 3), (ps, 2)):
        per_byte = free.predict(prof, res, st, optimizer="adam").breakdown["optimizer"]
        got = cm.predict(prof, res, st, optimizer="adam").breakdown["optimizer"]
        assert got == pytest.approx(per_byte + tensors * 50e-6)
    assert cm.predict(prof, res, ar, optimizer="sgd").breakdown["optimizer"] == pytest.approx(
        16000 * 1e-9 + 3 * 2e-6
    )
    # ranks taking turns on the cores take turns on the per-tensor work too
    four = toy_resources(4, cores=2)
    st4 = plan(prof, allreduce(0, 0, 0), four)
    gap = (
        cm.predict(prof, four, st4).breakdown["optimizer"]
        - free.predict(prof, four, st4).breakdown["optimizer"]
    )
    assert gap == pytest.approx(2 * 3 * 50e-6)
