"""Throughput and the metrics table, from hand-made records (no cluster)."""

from __future__ import annotations

import math
import statistics

import pytest

from distlab.runs import metrics


def _records(steps, world, batch, step_seconds, restart=0, start=0, offset=0):
    out = []
    for s in range(start, steps):
        for r in range(world):
            out.append(
                {
                    "run_id": "x",
                    "step": s,
                    "rank": r,
                    "loss": 1.0 / (s + 1),
                    "samples": offset + (s + 1 - start) * batch * world,
                    "step_time": step_seconds(s) * 0.9,
                    "comm_time": 0.0,
                    "wall_time": 1000.0 + sum(step_seconds(i) for i in range(start, s + 1)) + 0.001 * r,
                    "restart": restart,
                    "world": world,
                }
            )
    return out


def test_throughput_is_global_samples_over_median_step_time():
    df = metrics.frame(_records(20, 2, 16, lambda s: 0.1))
    assert metrics.throughput(df) == pytest.approx(32 / 0.1, rel=1e-6)


def test_warmup_steps_do_not_count():
    slow_start = metrics.frame(_records(20, 2, 16, lambda s: 2.0 if s < 3 else 0.1))
    assert metrics.throughput(slow_start) == pytest.approx(320, rel=1e-6)


def test_after_a_restart_throughput_is_the_last_world_size():
    recs = _records(10, 2, 16, lambda s: 0.1) + _records(
        30, 1, 16, lambda s: 0.2, restart=1, start=10, offset=320
    )
    df = metrics.frame(recs)
    assert metrics.throughput(df) == pytest.approx(16 / 0.2, rel=1e-6)
    assert list(df.columns[:10]) == metrics.COLUMNS


def test_no_records_means_no_throughput():
    assert math.isnan(metrics.throughput(metrics.frame([])))


@pytest.mark.parametrize("n,expected", [(1, 0), (2, 1), (10, 2), (100, 10)])
def test_warmup_share(n, expected):
    assert metrics.warmup_steps(n) == expected


def test_sequence_targets_pass_the_pre_launch_data_check():
    # the language model's targets are one class per position; the check uses the runtime's loss
    import torch

    import distlab as dl
    from distlab.errors import LaunchError
    from distlab.runs.validate import check_data

    model = dl.zoo.get("transformer_lm", layers=1, d_model=32, heads=4, vocab_size=64, seq_len=8)
    data = dl.data.synthetic(model, n=16)
    x, y = check_data(data, model, None)  # the batch the check trained a copy of the model on
    assert x.shape == y.shape == (2, 8) and y.dtype == torch.int64  # a class per position, accepted
    # and the check can refuse: targets that are not one per position fail before any launch
    inputs = torch.stack([data[i][0] for i in range(16)])
    with pytest.raises(LaunchError, match="cross-entropy"):
        check_data((inputs, torch.randint(0, 64, (16, 3))), model, None)


def test_slowest_median_is_each_steps_slowest_rank_then_the_median():
    # rank 0 is slow on steps 0, 3, 6..., rank 1 on steps 1, 4, 7...: each rank's median step is
    # fast, but two steps in three wait for a slow rank
    per_rank = [[0.3 if s % 3 == r else 0.1 for s in range(30)] for r in range(2)]
    assert max(statistics.median(r) for r in per_rank) == pytest.approx(0.1)
    assert metrics.slowest_median(per_rank) == pytest.approx(0.3)
    # and it is what throughput() takes of the same run's records
    recs = []
    for r, seconds in enumerate(per_rank):
        for s in range(30):
            recs.append(
                {
                    "run_id": "x",
                    "step": s,
                    "rank": r,
                    "loss": 1.0,
                    "samples": (s + 1) * 32,
                    "step_time": seconds[s],
                    "comm_time": 0.0,
                    "wall_time": 1000.0 + sum(seconds[: s + 1]),
                    "restart": 0,
                    "world": 2,
                }
            )
    assert metrics.throughput(metrics.frame(recs)) == pytest.approx(32 / 0.3, rel=1e-6)


@pytest.mark.parametrize("per_rank", [[], [[]], [[0.1, 0.2], [0.1]]])
def test_slowest_median_needs_steps_aligned_across_ranks(per_rank):
    with pytest.raises(ValueError, match="slowest_median"):
        metrics.slowest_median(per_rank)


def test_the_frame_cache_keeps_rows_not_records_and_a_resent_record_replaces_its_step():
    import tracemalloc

    import pandas as pd

    first = _records(3000, 2, 16, lambda s: 0.01)
    again = _records(3000, 2, 16, lambda s: 0.02, start=2500)  # steps 2500.. re-sent (a restart's)
    cache, keys = metrics.FrameCache(), set()
    tracemalloc.start()
    for rec in first + again:  # CHUNK-sized pieces become rows as they arrive
        key = (rec["restart"], rec["rank"], rec["step"])
        cache.add(dict(rec), new=key not in keys)
        keys.add(key)
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    df = cache.frame()
    expected = metrics.frame({(r["restart"], r["rank"], r["step"]): r for r in first + again}.values())
    pd.testing.assert_frame_equal(df, expected)
    assert df[df.step >= 2500]["step_time"].tolist() == pytest.approx([0.018] * 1000)  # the later kept
    # 6,000 rows: as rows about 100 bytes each; kept as dicts they took over 600 KB more
    assert held / len(df) < 400, held / len(df)
    cache.add({**first[0], "loss": 9.0}, new=False)
    assert len(cache.frame()) == 6000 and cache.frame()["loss"].iloc[0] == 9.0


def test_a_frame_asked_for_before_the_first_record_keeps_ranks_and_steps_integers():
    cache = metrics.FrameCache()
    assert len(cache.frame()) == 0  # a live view asks before any record arrived
    for rec in _records(3, 2, 16, lambda s: 0.1):
        cache.add(rec)
    df = cache.frame()
    assert df["rank"].tolist() == [0, 1] * 3 and str(df["rank"].dtype).startswith("int")


def test_a_runtime_column_asked_before_the_first_record_says_the_run_has_not_recorded_yet():
    """docs/consistency.md's ``run.metrics[[..., "staleness"]]`` right after a non-blocking launch
    raised pandas' bare KeyError; it now says why and what to do, and stays a KeyError for pandas."""
    import pickle

    empty = metrics.FrameCache().frame()
    assert list(empty[["rank", "step"]].columns) == ["rank", "step"]
    assert empty.get("staleness") is None and "staleness" not in empty
    with pytest.raises(KeyError, match=r"no rows yet .*'staleness'.*run\.wait\(\)"):
        empty[["rank", "staleness"]]
    assert type(pickle.loads(pickle.dumps(empty))).__name__ == "DataFrame"
    cache = metrics.FrameCache()
    cache.add({"run_id": "r", "step": 0, "rank": 0, "restart": 0, "staleness": 1})
    assert cache.frame()[["staleness"]].iloc[0, 0] == 1
    # docs/async-gossip.md's old example asked neighbour averaging for push-sum's "weight"
    with pytest.raises(KeyError, match=r"no column 'weight': this run's columns are run_id, .*staleness"):
        cache.frame()[["rank", "weight"]]
