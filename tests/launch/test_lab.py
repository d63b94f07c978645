"""Lab and Run on an in-process 2-worker cluster: the SPMD core, launching, live records, the trained
model."""

from __future__ import annotations

import re
import sys
import time

import cloudpickle
import pandas as pd
import pytest
import torch
from launch_helpers import Blobs, Gate, HeldBlobs, TinyNet, allreduce_strategy

import distlab as dl
from distlab.errors import DistlabError, LaunchError
from tests.polling import poll_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def _sum_ranks(rank, world, addr, port, scale):
    """Every rank contributes rank+1 through a real gloo all-reduce formed at the given store."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=10))
    pg = dist.ProcessGroupGloo(dist.PrefixStore("t", store), rank, world, timedelta(seconds=10))
    t = torch.tensor([float(rank + 1)])
    pg.allreduce([t]).wait()
    return {"rank": rank, "world": world, "sum": t.item() * scale, "threads": torch.get_num_threads()}


def test_resources_describe_the_live_cluster(clean_lab):
    res = clean_lab.resources
    assert res.world == 2
    assert [r.rank for r in res.ranks] == [0, 1]
    assert list(res.addresses) == sorted(res.addresses)  # one host: ordered by worker address
    assert all(r.host == "127.0.0.1" for r in res.ranks)
    page = clean_lab._repr_html_()
    assert res.addresses[0] in page and res.addresses[1] in page


def test_run_ranks_forms_a_group_and_returns_results_in_rank_order(clean_lab):
    out = clean_lab.run_ranks(_sum_ranks, 10.0)
    assert [o["rank"] for o in out] == [0, 1]
    assert all(o["world"] == 2 and o["sum"] == 30.0 for o in out)
    # 2 cores shared by 2 ranks on one host: one torch thread each (Dask would force 1 anyway)
    assert all(o["threads"] == 1 for o in out)


def test_run_ranks_on_a_sub_world(clean_lab):
    out = clean_lab.run_ranks(_sum_ranks, 1.0, world=1)
    assert out == [{"rank": 0, "world": 1, "sum": 1.0, "threads": 2}]


def test_launch_trains_and_reports_records_model_and_throughput(clean_lab, tiny, blobs):
    st = allreduce_strategy(tiny, clean_lab.resources)
    seen = []
    run = clean_lab.launch(
        tiny, strategy=st, steps=40, data=blobs, optimizer=lambda p: torch.optim.SGD(p, lr=0.1)
    )
    run.on_record.append(seen.append)
    assert run.wait(timeout=60) is run
    assert run.status == "finished" and run.error is None
    df = run.metrics
    assert len(df) == 80 and set(df["rank"]) == {0, 1} and sorted(set(df["step"])) == list(range(40))
    assert {"run_id", "loss", "samples", "step_time", "comm_time", "wall_time", "restart", "world"} <= set(
        df.columns
    )
    first, last = df[df.step < 5]["loss"].mean(), df[df.step >= 35]["loss"].mean()
    assert last < 0.7 * first, (first, last)
    assert 0 < run.throughput < 1e7
    assert len(seen) > 0  # live records reached the on_record hook while it ran
    model = run.model
    assert isinstance(model, TinyNet) and model is not tiny
    assert not torch.equal(model.fc1.weight, tiny.fc1.weight)  # trained, and the launched model is untouched
    row = clean_lab.runs.iloc[-1]
    assert (
        row["run_id"] == run.id and row["status"] == "finished" and row["world"] == 2 and row["batch"] == 16
    )
    assert row["measured_throughput"] == pytest.approx(run.throughput)
    card = run._repr_html_()
    assert "finished" in card
    assert clean_lab.cost_model is None  # never calibrated in this module: the card says why no prediction
    assert "none: the Lab had no cost model at launch; lab.calibrate() measures this cluster" in card
    assert "not calibrated (lab.calibrate())" in clean_lab._repr_html_()


def test_relaunch_reuses_the_warm_worker_processes(clean_lab, tiny, blobs):
    # how fast a warm relaunch is belongs to the launch-latency benchmark; here: that it is warm,
    # i.e. the same worker processes (torch already imported) serve every relaunch
    import os

    st = allreduce_strategy(tiny, clean_lab.resources)
    clean_lab.launch(tiny, strategy=st, steps=3, data=blobs, elastic=False).wait(60)
    pids = clean_lab.client.run(os.getpid)
    for _ in range(3):
        run = clean_lab.launch(tiny, strategy=st, steps=3, data=blobs, elastic=False)
        run.wait(60)
        assert run.status == "finished"
        assert run.launched_at < run.first_record_at
    assert clean_lab.client.run(os.getpid) == pids


def test_one_run_at_a_time(clean_lab, tiny, blobs):
    st = allreduce_strategy(tiny, clean_lab.resources)
    run = clean_lab.launch(tiny, strategy=st, steps=100000, data=blobs, elastic=False)
    try:
        with pytest.raises(LaunchError, match="still"):
            clean_lab.launch(tiny, strategy=st, steps=5, data=blobs)
    finally:
        run.cancel()
    assert run.status == "cancelled"
    assert ", cancelled (" in run.plot().layout.title.text  # its view says so


def test_a_strategy_on_fewer_ranks_runs_on_the_first_workers(clean_lab, tiny, blobs):
    st = allreduce_strategy(tiny, clean_lab.resources, world=1)
    run = clean_lab.launch(tiny, strategy=st, steps=5, data=blobs, block=True)
    assert set(run.metrics["rank"]) == {0} and run.world == 1


def test_lab_close_is_a_context_manager():
    from distlab.lab import Lab

    with Lab(workers=1) as lab:
        client = lab.client
        assert lab.resources.world == 1
    assert client.status == "closed"


def test_attach_with_a_client_leaves_it_open(clean_lab):
    from distlab.lab import Lab

    other = Lab(client=clean_lab.client)
    assert other.resources.addresses == clean_lab.resources.addresses
    other.close()
    assert clean_lab.client.status == "running"


def test_errors_are_distlab_errors():
    from distlab.lab import Lab

    with pytest.raises(DistlabError, match="workers"):
        Lab(workers=0)
    with pytest.raises(DistlabError, match="address= or client="):
        Lab(address="tcp://127.0.0.1:1", client=object())


def test_gpus_without_cuda_is_a_clear_error():
    from distlab.lab import Lab

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(LaunchError, match="dask-cuda|CUDA"):
        Lab(gpus=True)


def test_progress_bar_appears_for_long_waits(clean_lab, tiny, capsys, tmp_path):
    import threading

    from launch_helpers import Gate, HeldBlobs

    st = allreduce_strategy(tiny, clean_lab.resources)
    gate = Gate(tmp_path)  # held after 5 steps for 3 s: a wait longer than the bar's delay
    run = clean_lab.launch(tiny, strategy=st, steps=60, data=HeldBlobs(gate, free=5 * 16), elastic=False)
    threading.Timer(3.0, gate.release).start()
    run.wait(60)
    assert f"run {run.id}" in capsys.readouterr().err


def test_a_builder_name_and_synthetic_data(clean_lab, tiny):
    """strategy='AllReduce' is built for this model and the Lab; data=None is synthesised from its profile."""
    run = clean_lab.launch(tiny, strategy="AllReduce", steps=4, batch_size=8, elastic=False, block=True)
    assert run.status == "finished" and run.strategy.builder == "AllReduce" and run.world == 2
    assert len(run.metrics) == 8


def test_attach_by_address_runs_on_that_cluster_and_leaves_it_running(clean_lab, tiny, blobs):
    from distlab.lab import Lab

    other = Lab(address=clean_lab.client.scheduler.address)
    try:
        assert other.resources.addresses == clean_lab.resources.addresses
        run = other.launch(
            tiny, strategy=allreduce_strategy(tiny, other.resources), steps=3, data=blobs, elastic=False
        )
        assert run.wait(60).status == "finished"
    finally:
        other.close()
    assert len(clean_lab.resources.addresses) == 2  # closing an attached Lab leaves the cluster up


def test_unreachable_address_is_a_clear_error():
    from distlab.lab import Lab

    with pytest.raises(LaunchError, match="cannot reach the scheduler"):
        Lab(address="tcp://127.0.0.1:9", timeout=2)


def test_an_address_that_is_no_dask_scheduler_says_so_in_one_line_within_the_timeout():
    """A loopback server that answers as a web server does: Dask read its bytes as frame sizes and
    raised MemoryError ("Unable to allocate 3.01 EiB"), through IPython as a SystemError."""
    import socket
    import threading

    from distlab.lab import Lab

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def answer() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<html>hello</html>")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    start = time.monotonic()
    try:
        with pytest.raises(LaunchError, match="not a Dask scheduler") as info:
            Lab(address=f"tcp://127.0.0.1:{srv.getsockname()[1]}", timeout=5)
    finally:
        srv.close()
    assert time.monotonic() - start < 5 + 2 and "\n" not in str(info.value)


class IdsAndDense(torch.nn.Module):
    """A recommender-shaped model of two inputs: category ids and dense features."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.dense = torch.nn.Linear(3, 8)
        self.head = torch.nn.Linear(16, 2)

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.emb(ids).mean(1), self.dense(dense)], dim=1))


class IdsDenseData(torch.utils.data.Dataset):
    """((ids, dense), label) samples."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 50, (n, 4), generator=g)
        self.dense = torch.randn(n, 3, generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return (self.ids[i], self.dense[i]), self.y[i]


def test_a_builder_name_with_data_whose_input_mixes_ids_and_dense_features(clean_lab):
    """The launch profiles and checks the model on a batch of the user's data, not on an input it guesses."""
    model = IdsAndDense()
    run = clean_lab.launch(
        model, strategy="AllReduce", data=IdsDenseData(), steps=4, batch_size=8, elastic=False, block=True
    )
    assert run.status == "finished" and run.world == 2 and len(run.metrics) == 8
    assert run.strategy.batch.per_replica == 8  # built for the batch it trains at


class BNTo1x1(torch.nn.Module):
    """Conv + BatchNorm down to a 1x1 final map, then BatchNorm on it: one sample cannot train it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, stride=2, padding=1),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.BatchNorm2d(4),
        )
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


def test_a_batchnorm_model_with_a_1x1_final_map_passes_the_pre_launch_check(clean_lab):
    from distlab.runs.validate import check_data

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(32, 1, 8, 8, generator=g), torch.randint(0, 3, (32,), generator=g)
    )
    x, y = check_data(data, BNTo1x1(), None, 4)
    assert x.shape == (4, 1, 8, 8) and y.shape == (4,)  # the check ran a batch, as a rank will
    run = clean_lab.launch(
        BNTo1x1(), strategy="AllReduce", data=data, steps=3, batch_size=4, elastic=False, block=True
    )
    assert run.status == "finished"


def test_data_that_does_not_fit_the_model_is_one_line_naming_the_batch(clean_lab):
    bad = torch.utils.data.TensorDataset(torch.randn(16, 5), torch.randint(0, 2, (16,)))
    with pytest.raises(
        LaunchError, match=r"a batch of 8 samples \(input \[8, 5\]\) does not fit model IdsAndDense"
    ):
        clean_lab.launch(IdsAndDense(), strategy="AllReduce", data=bad, steps=2, batch_size=8)


def test_an_adaptive_batch_launch_measures_its_noise_and_reports_goodput(clean_lab, tiny, blobs):
    prof = dl.profile(tiny, batch_size=8)
    st = dl.strategy.build("AdaptiveBatch", prof, clean_lab.resources, batch_size=8, local_bsz_bounds=(8, 64))
    run = clean_lab.launch(
        tiny, strategy=st, steps=120, data=blobs, optimizer=lambda p: torch.optim.SGD(p, lr=0.05)
    )
    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.instance()  # a real IPython shell: the live view's displays go to its stdout
    view = run.live(interval=0.2)
    run.wait(timeout=120)
    view.join()
    df = run.metrics
    cols = {"global_batch", "accumulation", "noise_scale", "efficiency", "lr_gain", "progress", "goodput"}
    assert cols <= set(df.columns)
    last = df[df.step == df.step.max()].iloc[0]
    assert last["noise_scale"] > 0 and 0 < last["efficiency"] <= 1 and last["lr_gain"] >= 1
    assert df.groupby("step")["global_batch"].nunique().max() == 1  # every rank used the same batch
    assert (df.groupby("rank")["progress"].diff().dropna() > 0).all()  # progress only grows
    # a changed batch keeps the data position exact: each step advances it by its own global batch
    r0 = df[df["rank"] == 0].sort_values("step")
    assert (r0["samples"].diff().dropna().to_numpy() == r0["global_batch"].to_numpy()[1:]).all()
    # the live view drew while it trained, then once more at the end
    assert view.error is None and view.drawn >= 2  # the first drawing, then at least the final one
    fig = run.plot()
    traces = {t.name: t for t in fig.data}
    assert {
        "loss",
        "measured",
        "predicted",
        "rank 0",
        "rank 1",
        "global_batch",
        "noise_scale",
        "goodput",
    } <= set(traces)
    assert list(traces["global_batch"].y) == list(r0["global_batch"])
    # the reference line is the Lab's prediction of each step's configuration
    table = run.step_table
    want = [m / table[(b, m // (b * 2))] for m, b in zip(r0["global_batch"], r0["per_replica"])]
    assert list(traces["predicted"].y) == pytest.approx(want)
    assert "finished (120/120 steps)" in fig.layout.title.text
    # the view's widgets (what JupyterLab redraws from any thread) hold the final drawing too
    final = view.figure_widget.outputs[0]["data"]["application/vnd.plotly.v1+json"]["layout"]["title"]["text"]
    assert "finished (120/120 steps)" in final and "finished" in view.card_widget.value


def test_a_scaling_rule_the_optimizer_cannot_take_is_refused_before_the_launch(clean_lab, tiny, blobs):
    class NoRate(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"momentum": 0.9})

        def step(self, closure=None):
            return None

    prof = dl.profile(tiny, batch_size=8)
    st = dl.strategy.build("AdaptiveBatch", prof, clean_lab.resources, batch_size=8, lr_scaling="linear")
    with pytest.raises(DistlabError, match=r"NoRate has no numeric 'lr' .*use lr_scaling='none'"):
        clean_lab.launch(tiny, strategy=st, steps=5, data=blobs, optimizer=NoRate)


def test_a_second_lab_while_a_run_trains_works_beside_it_and_the_run_finishes(
    clean_lab, tiny, tmp_path, capfd
):
    # one notebook kernel, two Labs: the second's client became Dask's default, and the first
    # run's driver then waited on the second's event loop ("bound to a different event loop"):
    # the run failed and its ranks printed c10d "Broken pipe" frames
    gate = Gate(tmp_path)  # the ranks hold after 3 steps until released: the run trains throughout
    st = allreduce_strategy(tiny, clean_lab.resources)
    sgd = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    run = clean_lab.launch(tiny, strategy=st, steps=60, data=HeldBlobs(gate, free=3 * 16), optimizer=sgd)
    poll_for(lambda: run.steps_done >= 2, 60, "the first run's first steps")
    with dl.Lab(workers=1, timeout=20) as second:
        assert set(second.workers).isdisjoint(clean_lab.workers)  # a cluster of its own
        time.sleep(1.5)  # the first run's driver polls its ranks (every 0.5 s) with the second Lab up
        assert run.status == "running", run.error
        gate.release()
        assert run.wait(timeout=60).status == "finished"
        assert second.run_ranks(_sum_ranks, 1.0) == [{"rank": 0, "world": 1, "sum": 1.0, "threads": 2}]
        # and the first Lab goes on launching while the second is open (and Dask's default)
        assert clean_lab.launch(tiny, strategy=st, steps=3, data=Blobs(), block=True).status == "finished"
    losses = run.losses
    assert losses.iloc[-5:].mean() < 0.7 * losses.iloc[:5].mean(), losses
    assert "different event loop" not in capfd.readouterr().err


def test_a_run_without_a_prediction_says_why_its_forecast_is_missing(clean_lab, tiny, blobs, tmp_path):
    st = allreduce_strategy(tiny, clean_lab.resources)
    run = clean_lab.launch(tiny, strategy=st, steps=4, data=blobs, trace=True, block=True)
    assert clean_lab.cost_model is None and not run.forecast
    why = "the Lab had no cost model at launch; lab.calibrate() measures this cluster"
    assert why in repr(run.forecast)
    with pytest.raises(DistlabError, match=re.escape(f"run {run.id} has no forecast (prediction): {why}")):
        run.forecast.prediction  # noqa: B018 - what docs/keras.md reads
    assert pd.isna(clean_lab.runs.iloc[-1]["model_key"]) and "none: " + why in run._repr_html_()
    # its timeline and trace have no predicted row, rather than an error
    assert not any("predicted" in str(t.y) for t in run.timeline(steps=2).data)
    assert run.save_trace(tmp_path / "t.json").exists()


def test_wait_draws_the_live_views_final_figure_again_from_the_waiting_cell(clean_lab, tiny, blobs):
    """A run that ended between two cells: its view's thread drew the final figure under the id of
    a cell that had finished, which papermill no longer reads (the saved quickstart kept "pending
    (0/6 steps)" in a whole-suite run); ``run.wait()`` draws it once more from its own cell."""
    import time

    from IPython.core.interactiveshell import InteractiveShell

    InteractiveShell.instance()  # a real IPython shell: the live view's displays go to its stdout
    run = clean_lab.launch(tiny, strategy="AllReduce", steps=4, data=blobs, batch_size=8)
    view = run.live(interval=0.2)
    deadline = time.monotonic() + 120
    while view._thread.is_alive() and time.monotonic() < deadline:  # the run ended, its view drew
        time.sleep(0.05)
    assert run.done and not view._thread.is_alive()
    drawn = view.drawn
    run.wait()
    assert view.error is None and view.drawn == drawn + 1
    assert "finished (4/4 steps)" in str(run.plot().layout.title.text)
