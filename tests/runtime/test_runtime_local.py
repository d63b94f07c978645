"""In-process runtime checks (one rank, a HashStore): validation, data slicing, records, compressors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from runtime_bodies import BATCH, dataset, dense_model, make_job, strategy_for

from distlab.errors import LaunchError, StrategyError
from distlab.runtime import STEP_RECORD_KEYS, run_rank
from distlab.runtime.compress import Compressor
from distlab.runtime.data import RankBatches
from distlab.runtime.plan import build_units
from distlab.strategy.types import Partition, Strategy, Sync, VariablePlan


def test_rank_slices_tile_the_global_batch_in_order():
    data = dataset("dense", n=40)
    world = 3
    whole = RankBatches(data, BATCH * world, 0, 1, shuffle=False, seed=0).get(8)[0]
    parts = [RankBatches(data, BATCH, r, world, shuffle=False, seed=0).get(8)[0] for r in range(world)]
    assert torch.equal(torch.cat(parts), whole)
    assert torch.equal(whole, data.tensors[0][8 : 8 + BATCH * world])


def test_shuffle_is_a_shared_permutation_per_epoch():
    data = dataset("dense", n=12)
    b = RankBatches(data, 12, 0, 1, shuffle=True, seed=5)
    e0, e1 = b.get(0)[1], b.get(12)[1]
    assert sorted(e0.tolist()) == sorted(data.tensors[1].tolist()) == sorted(e1.tolist())
    assert not torch.equal(e0, e1)  # a new order each epoch
    assert torch.equal(RankBatches(data, 12, 0, 1, True, 5).get(0)[1], e0)  # same seed, same order


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_batch_inside_one_epoch_reads_the_indices_a_batch_across_epochs_does(shuffle):
    # get() slices one epoch's order; _index maps every position on its own (the epoch-crossing path)
    b = RankBatches(dataset("dense", n=10), 3, 0, 1, shuffle=shuffle, seed=2)
    for start in range(0, 40):
        expected = b._index(torch.arange(start, start + 3))
        assert torch.equal(b._slice(start, 3), expected), start
        assert torch.equal(b.get(start)[1], b.data.tensors[1][expected]), start
    if shuffle:  # each epoch its own order
        assert not torch.equal(b._slice(0, 3), b._slice(10, 3))


def test_partition_units_cover_the_variable_with_numpy_sizes():
    model = dense_model()
    plans = tuple(
        VariablePlan(n, partition=Partition(0, 3), shards=(Sync("allreduce"),) * 3)
        if n == "0.weight"
        else VariablePlan(n, Sync("allreduce"))
        for n, _ in model.named_parameters()
    )
    units = build_units(model, Strategy(plans, strategy_for("allreduce_own", model, 1).ranks), 1)
    shards = [u for u in units if u.name == "0.weight"]
    assert [(u.offset, u.size) for u in shards] == [(0, 4), (4, 3), (7, 3)]
    assert torch.equal(torch.cat([u.shadow for u in shards]), model[0].weight.detach())


def test_unknown_server_rank_is_named():
    model = dense_model()
    s = strategy_for("allreduce_own", model, 2)
    bad = Strategy((*s.variables[:-1], VariablePlan("2.bias", Sync("ps", server=7))), s.ranks)
    with pytest.raises(
        StrategyError, match=r"variables\[3\] \('2.bias'\).sync.server: rank 7 does not exist \(2 ranks\)"
    ):
        build_units(model, bad, 2)


def test_strategy_for_another_world_is_refused():
    model = dense_model()
    with pytest.raises(StrategyError, match="strategy has 3 ranks but the run has 2"):
        build_units(model, strategy_for("allreduce_own", model, 3), 2)


@pytest.mark.parametrize("kind, tol", [("fp16", 1e-3), ("bf16", 1e-2)])
def test_compressor_casts_on_the_wire_and_error_feedback_carries_the_residual(kind, tol):
    x = torch.randn(1000)
    c = Compressor(kind)
    wire = c.encode(0, x)
    assert wire.dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[kind]
    assert (c.decode(wire, torch.float32) - x).abs().max() < tol * x.abs().max()
    ef = Compressor(kind, error_feedback=True)
    sent = sum(ef.decode(ef.encode(0, x), torch.float32) for _ in range(50))
    plain = sum(c.decode(c.encode(0, x), torch.float32) for _ in range(50))
    assert (sent - 50 * x).abs().max() < (plain - 50 * x).abs().max()


def test_single_rank_run_emits_records_and_returns_weights():
    records = []
    job = make_job(0, 1, "", 0, "builder:PS", "dense", "sgd", 3)
    res = run_rank(job, emit=records.append, store=dist.HashStore())
    assert [r["step"] for r in records] == [0, 1, 2] and res["records"] == records
    # the keys every record has, then each step's forward and backward seconds
    assert all(tuple(r) == (*STEP_RECORD_KEYS, "compute") and r["compute"] > 0 for r in records)
    assert [r["samples"] for r in records] == [BATCH, 2 * BATCH, 3 * BATCH]
    assert all(r["comm_time"] >= 0 and r["step_time"] > 0 for r in records)
    assert torch.equal(res["state_dict"]["0.weight"], job.model[0].weight.detach())
    assert res["consensus_distance"] is None and not dist.is_initialized()


def test_steps_not_after_start_step_is_an_error():
    job = make_job(0, 1, "", 0, "builder:PS", "dense", "sgd", 2, start_step=2)
    with pytest.raises(LaunchError, match="steps: 2 <= start_step 2"):
        run_rank(job, store=dist.HashStore())


def test_run_options_refuse_an_unknown_sparse_exchange_mode_and_a_bad_bucket_naming_the_field():
    from distlab.errors import LaunchError
    from distlab.runtime.job import RunOptions

    assert RunOptions().sparse_exchange == "packed"
    assert RunOptions(sparse_exchange="per_table").sparse_exchange == "per_table"
    with pytest.raises(LaunchError, match=r"RunOptions.sparse_exchange: 'bulk'; expected 'packed'"):
        RunOptions(sparse_exchange="bulk")
    with pytest.raises(LaunchError, match=r"RunOptions.bucket_bytes must be an integer >= 1, got 0"):
        RunOptions(bucket_bytes=0)
    with pytest.raises(LaunchError, match=r"RunOptions.adaptive: \{'table'"):
        RunOptions(adaptive={"rows": []})
