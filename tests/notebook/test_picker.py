"""The strategy picker headless: every control changes the figure and picker.value."""

from __future__ import annotations

import json

import pytest

import distlab as dl
from distlab.errors import DistlabError
from distlab.notebook.picker import StrategyPicker


@pytest.fixture(scope="module")
def prof():
    return dl.ModelProfile.from_variables(
        [("emb.weight", (50_000, 16), "float32", True), ("fc1.weight", (256, 16)), ("fc1.bias", (256,)), ("fc2.weight", (10, 256))],
        time_per_sample=1e-4,
    )


@pytest.fixture
def picker(prof):
    return StrategyPicker(prof, dl.ResourceSpec.local(workers=2))


def bars(p):
    return [list(t.x) for t in p.figure.data[:3]]


def test_initial_state_has_a_value_a_prediction_and_a_ranked_table(picker):
    assert isinstance(picker.value, dl.Strategy) and picker.value.builder == "AllReduce"
    assert picker.prediction.throughput > 0
    assert len(picker.table.options) >= 3
    # the first bar is the selected strategy, the rest the top candidates, in ranked order
    throughputs = [float(label.split("/s")[0].replace(",", "")) for label, _ in picker.table.options]
    assert throughputs == sorted(throughputs, reverse=True)
    assert picker.figure.data[0].y[0].startswith("selected: AllReduce")


@pytest.mark.parametrize(
    "builder, control, value, option",
    [
        ("AllReduce", "chunk_size", 16, "chunk_size"),
        ("AllReduce", "compressor", "fp16", "compressor"),
        ("PS", "servers", "all", "servers"),
        ("Gossip", "topology", "ring", "topology"),
        ("Gossip", "mode", "awc", "mode"),
    ],
)
def test_each_option_control_changes_the_strategy(picker, builder, control, value, option):
    picker.builder.value = builder
    assert picker.value.builder == builder
    getattr(picker, control).value = value
    assert picker.value.options.get(option) == value
    assert picker.figure.data[0].y[0] == "selected: " + picker.value.name


def test_controls_a_builder_does_not_take_are_disabled(picker):
    picker.builder.value = "PS"
    assert picker.chunk_size.disabled and picker.topology.disabled and not picker.servers.disabled
    picker.builder.value = "Gossip"
    assert not picker.topology.disabled and picker.chunk_size.disabled


def test_batch_changes_the_prediction(picker):
    before = picker.prediction.step_time
    picker.batch.value = picker.batch.value * 4
    assert picker.value.batch.per_replica == picker.batch.value
    assert picker.prediction.step_time > before


def test_what_if_workers_and_bandwidth_change_the_plan_and_the_chart(picker):
    picker.workers.value = 8
    assert picker.value.world == 8
    assert 8 in list(picker.figure.data[3].x)
    comm_before = picker.prediction.breakdown["comm"]
    picker.bandwidth.value = 0.01
    assert picker.prediction.breakdown["comm"] > comm_before
    assert bars(picker)[1][0] == pytest.approx(picker.prediction.breakdown["comm"])


def test_clicking_a_candidate_selects_it(picker):
    label, index = picker.table.options[2]
    picker.table.value = index
    assert label.strip().endswith(picker.value.name)


def test_save_writes_the_selected_strategy(picker, tmp_path):
    picker.builder.value = "Parallax"
    path = picker.save(tmp_path / "chosen.json")
    loaded = dl.Strategy.load(path)
    assert loaded == picker.value and json.loads(path.read_text())["builder"]["name"] == "Parallax"


def test_without_a_lab_launch_is_disabled(picker):
    assert picker.launch_button.disabled


def test_a_non_resource_argument_is_a_clear_error(prof):
    with pytest.raises(DistlabError, match="Lab or a ResourceSpec"):
        StrategyPicker(prof, "cluster")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launch_button_runs_the_strategy_and_plots_the_measured_point():
    import torch.nn as nn

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    prof = dl.profile(model, batch_size=8)
    with dl.Lab(workers=2) as lab:
        picker = StrategyPicker(prof, lab, model=model)
        assert not picker.launch_button.disabled
        picker.builder.value = "PS"
        picker.steps.value = 6
        picker.launch_button.click()
        assert len(lab.runs) == 1 and lab.runs.iloc[0]["status"] == "finished"
    point = picker.measured.data[0]
    assert list(point.text) == ["PS"]
    assert point.y[0] == pytest.approx(picker.runs[0]["measured_throughput"]) and point.y[0] > 0
    assert point.x[0] == pytest.approx(picker.runs[0]["predicted_throughput"]) and point.x[0] > 0
    assert "measured" in picker.status.value
