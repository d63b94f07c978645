"""sweep.measure_grid on a real Lab: rounds, rows, and the unrecorded warm-up runs."""

from distlab import sweep
from distlab.costmodel import CostModel

MODELS = [["mlp", {"width": 16}], ["wide_deep", {"rows": 200}]]


def test_measure_grid_warms_each_model_up_once_then_records_every_round(lab):
    configs = sweep.plan_grid(lab.resources, CostModel.default(), MODELS, ["AllReduce", "PS"], [8])
    assert len(configs) == 4
    before = len(lab.runs)
    df = sweep.measure_grid(lab, configs, steps=8, repeats=2)
    runs = lab.runs.iloc[before:]
    # two warm-up runs (one per model, 4 steps) ahead of 2 rounds x 4 configurations
    assert list(runs["steps"]) == [4, 4] + [8] * 8
    assert list(runs["status"].unique()) == ["finished"]
    assert len(df) == 8 and sorted(df["repeat"].unique()) == [0, 1]
    assert (df["measured_throughput"] > 0).all() and (df["measured_step_time"] > 0).all()
    # the second round runs the configurations in reverse order
    first, second = df[df["repeat"] == 0], df[df["repeat"] == 1]
    assert list(first["strategy"]) == list(reversed(list(second["strategy"])))

    again = sweep.measure_grid(lab, configs[:1], steps=8, repeats=1, warmup=False)
    assert len(lab.runs) == before + 10 + 1 and len(again) == 1
