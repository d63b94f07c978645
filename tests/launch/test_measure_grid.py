"""Measuring on a real Lab: grid.measure_grid (rounds, rows, unrecorded warm-up runs) and the training-loop
stage's passes."""

import statistics

import pytest

from distlab.bench import grid
from distlab.costmodel import CostModel

MODELS = [["mlp", {"width": 16}], ["wide_deep", {"rows": 200}]]


def test_measure_grid_warms_each_model_up_once_then_records_every_round(lab):
    configs = grid.plan_grid(lab.resources, CostModel.default(), MODELS, ["AllReduce", "PS"], [8])
    assert len(configs) == 4
    before = len(lab.runs)
    df = grid.measure_grid(lab, configs, steps=8, repeats=2)
    runs = lab.runs.iloc[before:]
    # two warm-up runs (one per model, 4 steps) ahead of 2 rounds x 4 configurations
    assert list(runs["steps"]) == [4, 4] + [8] * 8
    assert list(runs["status"].unique()) == ["finished"]
    assert len(df) == 8 and sorted(df["repeat"].unique()) == [0, 1]
    assert (df["measured_throughput"] > 0).all() and (df["measured_step_time"] > 0).all()
    # the second round runs the configurations in reverse order
    first, second = df[df["repeat"] == 0], df[df["repeat"] == 1]
    assert list(first["strategy"]) == list(reversed(list(second["strategy"])))

    again = grid.measure_grid(lab, configs[:1], steps=8, repeats=1, warmup=False)
    assert len(lab.runs) == before + 10 + 1 and len(again) == 1


def test_short_configurations_run_for_min_seconds(lab, monkeypatch):
    from distlab.errors import DistlabError

    configs = grid.plan_grid(lab.resources, CostModel.default(), MODELS[:1], ["AllReduce"], [8])
    configs[0]["predicted_step_time"] = 0.01  # a run of 8 steps would last 0.08 s
    before = len(lab.runs)
    df = grid.measure_grid(lab, configs, steps=8, repeats=1, warmup=False, min_seconds=0.3)
    # enough steps for 0.3 s at the predicted step time; recorded with the row
    assert list(lab.runs.iloc[before:]["steps"]) == [30] and list(df["steps"]) == [30]
    configs[0]["predicted_step_time"] = 1.0  # already longer than min_seconds: steps as asked
    assert list(
        grid.measure_grid(lab, configs, steps=8, repeats=1, warmup=False, min_seconds=0.3)["steps"]
    ) == [8]
    monkeypatch.setattr(grid, "MAX_STEPS", 40)
    configs[0]["predicted_step_time"] = 1e-6  # 300,000 steps: capped at MAX_STEPS
    assert list(
        grid.measure_grid(lab, configs, steps=8, repeats=1, warmup=False, min_seconds=0.3)["steps"]
    ) == [40]
    with pytest.raises(DistlabError, match="min_seconds"):
        grid.measure_grid(lab, configs, steps=8, repeats=1, min_seconds=-1)


def test_training_loop_stage_passes_go_over_every_world_size_in_turn(lab, monkeypatch):
    import torch

    import distlab as dl
    from distlab.calibration import measure
    from distlab.calibration.measure import measure_training_loop
    from distlab.costmodel.compute import model_key

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    cases = [(model, data, 4, ("AllReduce", "PS"))]
    profiles = [dl.profile(model, batch_size=4)]
    calls = []
    run_ranks = lab.cluster.run_ranks

    def spy(fn, local, threads, jobs, *args, **kw):  # the real call, noted with what it returned
        out = run_ranks(fn, local, threads, jobs, *args, **kw)
        calls.append((kw.get("world"), len(local), [j[5] for j in jobs], out))
        return out

    lab.cluster.run_ranks = spy
    # every case short (the schedule is what this tests): on a loaded machine the first pass's
    # local steps can price this small model's step past SHORT_STEP, and it then gets one pass
    monkeypatch.setattr(measure, "SHORT_STEP", 10.0)
    try:
        cm = measure_training_loop(lab.cluster, CostModel.default(), lab.resources, cases, profiles, [1, 2])
    finally:
        del lab.cluster.run_ranks
    # short cases: three passes, one per call, world sizes 1, 2 then 2, 1 then 1, 2; each call
    # first takes the model's local step, then one pass of each case
    assert [c[0] for c in calls] == [1, 2, 2, 1, 1, 2]
    assert all(n_local == 1 and passes == [1, 1] for _, n_local, passes, _ in calls)
    rows = cm.fingerprint["overhead_runs"]
    assert [(r["world"], r["builder"]) for r in rows] == [
        (1, "AllReduce"),
        (1, "PS"),
        (2, "AllReduce"),
        (2, "PS"),
    ]
    # a case's figure is timed as a run's throughput: its steps pooled over the three passes,
    # each step's slowest rank, then the median
    for n, r in enumerate(rows):
        world, case = r["world"], n % 2
        per_rank = [[t for c in calls if c[0] == world for t in c[3][rank][1][case]] for rank in range(world)]
        assert len(per_rank[0]) == 3 * len(calls[0][3][0][1][case]) > 0
        assert r["measured"] == pytest.approx(statistics.median(max(s) for s in zip(*per_rank)))
    # the model's local steps of those passes: its compute in the predictions the loop is fitted against
    local = cm.fingerprint["local_steps"]
    assert sorted(r["ranks"] for r in local) == [1, 2] and {r["key"] for r in local} == {
        model_key(profiles[0])
    }
    # (the model's step less the loop's own fitted terms, at least a tenth of the step: where
    # fit_compute's loop terms pass 90% of a step, as for this 1 ms step of 2 ranks on a loaded
    # machine, the compute part is that tenth and the loop's terms come on top: CostModel.slowdowns)
    prm = cm.params
    for r in rows:
        step = next(x["seconds"] for x in local if x["ranks"] == r["world"])
        loop = (
            prm.step_overhead + prm.tensor_overhead * r["tensors"] + prm.lockstep_overhead * (r["world"] > 1)
        )
        assert r["compute"] == pytest.approx(max(step - loop, 0.1 * step) + loop), (r, loop)
