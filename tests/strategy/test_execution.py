"""One description of what the runtime executes: the runtime's buckets, DDP choice and threads are
the ones the cost model prices."""

from __future__ import annotations

import pytest

import distlab as dl
from distlab.costmodel.compile import compile_strategy
from distlab.runtime.allreduce import build_buckets
from distlab.runtime.plan import build_units
from distlab.strategy.execution import BUCKET_BYTES, bucket_layout, ddp_applies, rank_threads


def test_threads_share_the_host_cores():
    assert [rank_threads(n, 8) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    assert rank_threads(2, None) == 1


def test_bucket_layout_splits_per_key_at_the_cap_and_the_first_bucket_at_its_own():
    entries = [("a", 3), ("a", 3), ("b", 1), ("a", 3), ("b", 5)]
    assert bucket_layout(entries, cap=6) == [[0, 1], [2, 4], [3]]  # a bucket takes bytes up to the cap
    assert bucket_layout(entries, cap=6, first_cap=3) == [[0], [1, 3], [2, 4]]


def _units_in_ready_order(model, st):
    order = {id(p): i for i, p in enumerate(model.parameters())}
    units = build_units(model, st, st.world)
    return sorted(units, key=lambda u: (-order[id(u.param)], u.shard or 0))


@pytest.mark.parametrize(
    "model_name, builder, options",
    [
        ("mlp", "AllReduce", {}),
        ("mlp", "AllReduce", {"chunk_size": 2}),
        # seconds each (the default-size models' profiles and chunks): left to `make test`
        pytest.param("convnet", "AllReduce", {"chunk_size": 4}, marks=pytest.mark.slow),
        ("convnet", "PartitionedAR", {}),
        pytest.param("transformer_lm", "AllReduce", {}, marks=pytest.mark.slow),
    ],
)
def test_the_runtime_buckets_are_the_ones_the_cost_model_prices(model_name, builder, options):
    model = dl.zoo.get(model_name)
    prof = dl.profile(model, batch_size=4)
    st = dl.strategy.build(builder, prof, dl.ResourceSpec.local(2), **options)
    units = [u for u in _units_in_ready_order(model, st) if u.sync.kind == "allreduce"]
    runtime = build_buckets(units, 2, False, BUCKET_BYTES, lambda w: None)
    priced = compile_strategy(prof, st, ddp=False).task_ar_bytes
    got = sorted(sum(u.view(u.param).numel() * u.param.element_size() for u in b.units) for b in runtime)
    assert len(runtime) == len(priced[priced > 0]) and got == pytest.approx(sorted(priced[priced > 0]))


def test_ddp_applies_to_pure_all_reduce_only_and_both_sides_agree():
    res = dl.ResourceSpec.local(2)
    dense = dl.profile(dl.zoo.get("mlp"), batch_size=4)
    wide = dl.profile(dl.zoo.get("wide_deep"), batch_size=4)
    ar = dl.strategy.build("AllReduce", dense, res)
    assert ddp_applies(ar) and compile_strategy(dense, ar).ddp
    assert not ddp_applies(dl.strategy.build("PS", dense, res))
    assert not ddp_applies(dl.strategy.build("PartitionedAR", dense, res))
    assert not ddp_applies(ar, error_feedback=True)
    sparse = [v.name for v in wide.variables if v.sparse]
    wide_ar = dl.strategy.build("AllReduce", wide, res)
    assert sparse and not ddp_applies(wide_ar, sparse)
    assert not ddp_applies(dl.strategy.build("AllReduce", dense, dl.ResourceSpec.local(1)))
