"""The strategy picker headless: every control changes the figure and picker.value."""

from __future__ import annotations

import html
import json
import re
import tempfile
from pathlib import Path

import pytest

import distlab as dl
from distlab.errors import DistlabError, StrategyError
from distlab.notebook.picker import StrategyPicker
from distlab.notebook.ranking import SINGLE_PROCESS


@pytest.fixture(scope="module")
def prof():
    return dl.ModelProfile.from_variables(
        [
            ("emb.weight", (50_000, 16), "float32", True),
            ("fc1.weight", (256, 16)),
            ("fc1.bias", (256,)),
            ("fc2.weight", (10, 256)),
        ],
        time_per_sample=1e-4,
    )


@pytest.fixture
def picker(prof):
    return StrategyPicker(prof, dl.ResourceSpec.local(workers=2))


def name_of(label):
    """The strategy a list row names: after its figures, before its goodput or a note in brackets."""
    name = label.split("  [")[0].split("  (goodput")[0].split("  ")[-1]
    return name.split(" = ")[0].strip()  # of a merged tie, the first


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


def test_what_if_hosts_like_this_one_and_the_network_change_the_plan_and_the_chart(picker):
    per = picker.per_host.value
    picker.hosts.value = 4  # four hosts like this one: its ranks per host and cores kept
    assert picker.value.world == 4 * per and picker.world == 4 * per
    res = picker.resources()
    assert res.num_hosts == 4 and {len(res.ranks_on(h)) for h in res.hosts} == {per}
    assert set(res.cores.values()) == {picker.base_resources.cores[picker.base_resources.hosts[0]]}
    assert 4 in list(picker.figure.data[3].x)
    assert "4 hosts like this one" in picker.status.value
    picker.network.value = "10 Gb/s Ethernet"
    assert picker.net_bandwidth.value == 10 and picker.net_latency.value == 50
    slow = picker.prediction.breakdown["comm"]
    picker.network.value = "InfiniBand HDR (200 Gb/s)"
    fast = picker.prediction.breakdown["comm"]
    assert fast < slow
    assert bars(picker)[1][0] == pytest.approx(fast * 1e3)  # ms
    picker.net_bandwidth.value = 1.0  # typing a figure makes the network custom (InfiniBand's latency kept)
    assert picker.network.value == "custom" and picker.prediction.breakdown["comm"] > fast
    picker.per_host.value = 1
    assert picker.value.world == 4


def test_a_what_if_of_eight_hosts_names_the_link_that_saturates(picker):
    picker.builder.value = "PS"  # one server: every other host's ranks pull its values through its link
    picker.hosts.value = 8
    picker.network.value = "10 Gb/s Ethernet"
    title = picker.figure.layout.title.text
    assert title.startswith("bottleneck: out of ") and "flows for the servers' new values" in title, title
    assert html.escape(title) in picker.status.value  # the plan line says it too
    picker.hosts.value = 1  # one host: no link between hosts to name
    assert not picker.figure.layout.title.text


def test_what_if_controls_refuse_what_the_model_cannot_mean(picker):
    for control, bad in (
        (picker.hosts, 0),
        (picker.per_host, -1),
        (picker.net_bandwidth, 0.0),
        (picker.net_latency, 0.0),
    ):
        control.value = bad
        assert control.value > 0  # clamped to the control's bound: no zero hosts, no zero bandwidth
    assert picker.prediction.throughput > 0


def test_clicking_a_candidate_selects_it(picker):
    label, index = picker.table.options[3]
    picker.table.value = index
    assert name_of(label) == picker.value.name
    assert picker.value.world == 2 and picker.world == 2


def test_the_list_has_the_single_process_row_last_and_ties_once(picker):
    labels = [label for label, _ in picker.table.options]
    assert labels[-1].strip().endswith(SINGLE_PROCESS)
    # fp16 and bf16 move the same bytes at 2 workers: one row names both, no other row names either
    tied = [label for label in labels if "compressor=fp16" in label or "compressor=bf16" in label]
    assert len(tied) == 1 and "AllReduce(compressor=fp16) = AllReduce(compressor=bf16)" in tied[0]
    picker.table.value = labels.index(tied[0])
    assert picker.value.builder == "AllReduce" and picker.value.world == 2


def test_picking_the_single_process_row_selects_allreduce_on_one_worker(picker):
    row = [i for label, i in picker.table.options if label.strip().endswith(SINGLE_PROCESS)][0]
    picker.table.value = row
    assert picker.world == 1 and picker.value.world == 1 and picker.value.builder == "AllReduce"
    listed = float(picker.table.options[row][0].split("/s")[0].replace(",", ""))  # the row's figure, as shown
    assert picker.prediction.throughput == pytest.approx(listed, abs=0.5)
    assert "on 1 worker" in picker.status.value
    assert picker.table.value == row  # the list stays the one it was picked from


def test_the_list_and_status_read_as_integers_per_second_and_milliseconds(picker):
    for label, _ in picker.table.options:
        assert re.match(r"^ *\d{1,3}(,\d{3})*/s +\d[\d,]*\.\d ms  \S", label), label
    assert re.search(r"\d{1,3}(,\d{3})* samples/s predicted, step \d+\.\d ms", picker.status.value)
    # one process is not fastest here: the note says only what the list's order leaves out
    assert picker.note.value.startswith("convergence not counted for 3 stale or asynchronous plan(s)")
    # what the figure rests on, on the plan line: the profile, and no calibration (the default model)
    assert "(from the profile, typically within 20%)" in picker.status.value
    assert "not calibrated: default collectives" in picker.status.value


def test_the_note_says_when_one_process_is_predicted_fastest():
    from distlab.resources import Link

    big = dl.ModelProfile.from_variables([("w", (4096, 4096))], time_per_sample=1e-6)
    res = dl.ResourceSpec.local(workers=2)
    slow = res.with_links(**{c: Link(1e-3, 1e8) for c in res.links})  # 64 MB at 100 MB/s: 0.64 s a step
    picker = StrategyPicker(big, slow)
    assert "one process is predicted fastest" in picker.note.value
    assert picker.table.options[0][0].strip().endswith(SINGLE_PROCESS)


def test_an_unexpected_error_in_a_callback_shows_in_the_widget_with_its_log(picker, monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the log goes to the system temp dir
    monkeypatch.setattr(picker, "_build", broken)
    picker.chunk_size.value = 16
    status = picker.status.value
    assert "color:#b00" in status and "distlab: update failed: RuntimeError: boom" in status
    assert "\n" not in status
    log = Path(re.search(r"traceback: ([^)]+)\)", status).group(1))
    assert log.name.startswith("distlab-picker-") and log.parent == tmp_path and log == picker.log_path
    assert "Traceback" in log.read_text() and "RuntimeError: boom" in log.read_text()
    monkeypatch.undo()
    picker.chunk_size.value = 32
    assert "samples/s predicted" in picker.status.value and "color:#b00" not in picker.status.value


def test_a_distlab_error_in_a_callback_shows_as_one_line_without_a_log(picker, monkeypatch):
    def refuse(*args, **kwargs):
        raise StrategyError("AllReduce: chunk_size 16 is too small\nuse 32 or more")

    monkeypatch.setattr(picker, "_build", refuse)
    picker.chunk_size.value = 16
    assert "distlab: AllReduce: chunk_size 16 is too small use 32 or more" in picker.status.value
    assert "traceback" not in picker.status.value and picker.log_path is None


def test_save_writes_the_selected_strategy(picker, tmp_path):
    picker.builder.value = "Parallax"
    path = picker.save(tmp_path / "chosen.json")
    loaded = dl.Strategy.load(path)
    assert loaded == picker.value and json.loads(path.read_text())["builder"]["name"] == "Parallax"


def test_without_a_lab_launch_is_disabled(picker):
    assert picker.launch_button.disabled
    picker.launch_button.click()  # clicked anyway (from code): it says why nothing runs
    assert "distlab: no Lab: pass a Lab" in picker.status.value and picker.launch_thread is None


def test_a_non_resource_argument_is_a_clear_error(prof):
    with pytest.raises(DistlabError, match="Lab or a ResourceSpec"):
        StrategyPicker(prof, "cluster")


def test_an_adaptive_strategy_shows_goodput_at_the_noise_scale_set(prof):
    picker = StrategyPicker(prof, dl.ResourceSpec.local(workers=2), noise_scale=64)
    adaptive = [label for label, _ in picker.table.options if "AdaptiveBatch" in label]
    assert adaptive and all("goodput" in label for label in adaptive)
    assert not any("goodput" in label for label, _ in picker.table.options if "AdaptiveBatch" not in label)
    picker.builder.value = "AdaptiveBatch"
    status = picker.status.value
    found = re.search(
        r"goodput <b>([\d,]+)</b> samples/s at φ = 64: .* \(global batch (\d+)\) .* efficiency (0\.\d\d)",
        status,
    )
    assert found, status
    eff = float(found.group(3))
    assert eff == pytest.approx((64 + prof.batch_size) / (64 + int(found.group(2))), abs=0.01)
    # a larger noise scale: larger batches are worth their samples, so the batch does not shrink
    picker.noise_scale.value = 1e5
    bigger = re.search(r"\(global batch (\d+)\)", picker.status.value)
    assert int(bigger.group(1)) >= int(found.group(2))
    picker.noise_scale.value = 0  # unknown: goodput asks for it
    assert "goodput: set the noise scale" in picker.status.value
    assert not any("goodput" in label for label, _ in picker.table.options)


def test_measure_fills_the_noise_scale_from_the_model_on_its_data():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    prof = dl.profile(model, sample_input=torch.randn(8, 8), batch_size=8)
    data = (torch.randn(512, 8), torch.randint(0, 3, (512,)))
    picker = StrategyPicker(prof, dl.ResourceSpec.local(workers=2), model=model, data=data)
    assert not picker.measure_button.disabled and picker.noise_scale.value == 0
    picker.builder.value = "AdaptiveBatch"
    picker.measure_button.click()
    m = picker.noise_measurement
    assert (
        m is not None
        and m.noise_scale > 0
        and picker.noise_scale.value == pytest.approx(m.noise_scale, rel=1e-3)
    )
    assert "goodput <b>" in picker.status.value and "measured: noise scale" in picker.status.value


def test_measure_without_data_says_what_it_needs(picker):
    assert picker.measure_button.disabled
    picker.measure_button.click()
    assert "measure φ: create the picker with model=... and data=..." in picker.status.value


def test_the_picker_offers_asynchronous_gossip_beside_sync_and_ranks_it():
    dense = dl.ModelProfile.from_variables(
        [("fc1.weight", (256, 16)), ("fc1.bias", (256,)), ("fc2.weight", (10, 256))], time_per_sample=1e-4
    )
    picker = StrategyPicker(dense, dl.ResourceSpec.local(workers=4), top=80)
    picker.builder.value = "Gossip"
    assert [v for _, v in picker.mode.options] == ["atc", "awc", "push_sum", "average"]
    picker.mode.value = "push_sum"
    g = picker.value.gossip
    assert g.asynchronous and g.mode == "push_sum" and picker.value.options["asynchronous"] is True
    assert "asynchronous gossip (push_sum): every rank at its own pace" in html.unescape(picker.status.value)
    assert "consensus: exp2 over 4 ranks" in html.unescape(picker.status.value)
    picker.mode.value = "awc"
    assert not picker.value.gossip.asynchronous and picker.value.gossip.mode == "awc"
    # the list ranks the asynchronous candidates beside the synchronous ones; picking one keeps it so
    labels = [label for label, _ in picker.table.options]
    mine = [i for i, label in enumerate(labels) if "asynchronous=True" in label and "mode=average" in label]
    assert mine and any("Gossip(mode=atc" in label for label in labels)
    picker.table.value = mine[0]
    assert picker.value.gossip.asynchronous and picker.mode.value == "average"
    assert picker.value.name == name_of(labels[mine[0]])


def test_stale_and_asynchronous_rows_say_their_convergence_is_not_counted_until_g_is_given(prof):
    picker = StrategyPicker(prof, dl.ResourceSpec.local(workers=2), top=80)
    labels = [label for label, _ in picker.table.options]
    stale = [label for label in labels if "staleness=" in label or "sync=False" in label]
    assert len(stale) >= 2 and all("[convergence not counted: lab.probe_staleness]" in s for s in stale)
    assert not any("convergence" in label for label in labels if label not in stale)
    picker.table.value = labels.index(stale[0])  # picked: its plan line says it too
    assert picker.value.stale and "convergence not counted: lab.probe_staleness" in picker.status.value
    picker.table.value = next(i for i, label in enumerate(labels) if name_of(label) == "AllReduce")
    assert "convergence not counted" not in picker.status.value
    # g for staleness 1 only: staleness 4 and asynchronous PS are unpriced, listed after every priced plan
    priced = StrategyPicker(prof, dl.ResourceSpec.local(workers=2), top=80, staleness_cost={1: 1.5})
    rows = [label for label, _ in priced.table.options]
    unpriced = [i for i, label in enumerate(rows) if "[convergence not counted" in label]
    assert unpriced and unpriced == list(range(len(rows) - len(unpriced), len(rows)))
    assert all("goodput" not in rows[i] for i in unpriced)
    one = next(label for label in rows if name_of(label).endswith("staleness=1)"))
    assert "(goodput" in one and "convergence" not in one
