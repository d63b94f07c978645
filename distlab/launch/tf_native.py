"""Native TensorFlow runs (``lab.launch(keras_model, ..., backend="tensorflow")``): each rank a
child process of its pinned Dask task. AllReduce runs as MultiWorkerMirroredStrategy; PS and
PartitionedPS as ParameterServerStrategy (each rank's process a worker and a parameter server,
rank 0's also the chief; the other ranks serve until the chief's rank says it is done).

The client builds one payload (``native_payload``): the model as a ``.keras`` file, the data as
arrays, the loss and an optimizer factory. Each rank's task (``train_rank_tf``, run through the
same SPMD launcher as torch ranks):

1. picks a free port on its host and publishes ``host:port`` in the run's rendezvous store; reads
   every rank's, so ``TF_CONFIG`` is built from ports the workers chose themselves;
2. starts ``runtime/tf_child.py`` in a new process session with that ``TF_CONFIG``, reads its
   per-step JSON records and forwards them as the run's live records;
3. owns the deadlines: the child must report its first step within ``timeout`` seconds (a peer
   that never starts blocks TensorFlow's strategy constructor with no timeout of its own), and a
   step within ``timeout`` of the previous one; a stop request (cancel, a failed peer) or a
   missed deadline kills the child's whole process group. No child outlives its task.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from distlab.errors import LaunchError
from distlab.resources import host_of

CHILD = Path(__file__).resolve().parents[1] / "runtime" / "tf_child.py"
# the builders TensorFlow runs natively, and as what: MultiWorkerMirroredStrategy, ParameterServerStrategy
NATIVE_BUILDERS = {"AllReduce": "mirrored", "PS": "ps", "PartitionedPS": "ps"}
POLL = 0.2  # seconds between checks of the child, the stop flag and the deadline


def check_native(model: Any, strategy: Any) -> None:
    """What the native route can run: a Keras 3 model, a builder of ``NATIVE_BUILDERS``, a clean environment."""
    from distlab.keras_model import is_keras_model

    if not is_keras_model(model):
        raise LaunchError(
            f"backend='tensorflow': model must be a Keras model, got {type(model).__name__}; "
            "torch models run with backend='torch' (the default)"
        )
    if "TF_CONFIG" in os.environ:
        raise LaunchError(
            "backend='tensorflow': TF_CONFIG is set in this process's environment; distlab builds each rank's "
            "TF_CONFIG from the ports its workers choose: unset it (del os.environ['TF_CONFIG'])"
        )
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None:
        raise LaunchError(
            "backend='tensorflow': TensorFlow is not installed; pip install 'distlab[tf]' (or run the Keras model "
            "with backend='torch')"
        )
    builder = getattr(strategy, "builder", strategy)
    if builder not in NATIVE_BUILDERS:
        raise LaunchError(
            f"backend='tensorflow': strategy {getattr(strategy, 'name', strategy)} is not one TensorFlow runs natively "
            f"here (natively: AllReduce as MultiWorkerMirroredStrategy, PS and PartitionedPS as ParameterServerStrategy); "
            "run it with backend='torch'"
        )


def arrays(data: Any) -> tuple[Any, Any]:
    """``data`` as (inputs, targets) NumPy arrays: what the TensorFlow processes read."""
    import numpy as np

    from distlab.data import as_dataset

    ds = as_dataset(data)
    tensors = getattr(ds, "tensors", None) or (getattr(ds, "inputs", None), getattr(ds, "targets", None))
    if tensors[0] is None:
        raise LaunchError("backend='tensorflow': data must be an (inputs, targets) pair of arrays or tensors")
    x, y = (np.asarray(t.cpu() if hasattr(t, "cpu") else t) for t in tensors[:2])
    return x, y


def _check_plain_sgd(optimizer: Any) -> None:
    """Natively, partitioned variables train with plain SGD (Keras 3's optimizers cannot update
    TensorFlow's ShardedVariables): refuse any other optimizer before the launch."""
    if optimizer is None:
        return
    opt = optimizer()
    if type(opt).__name__ != "SGD" or float(getattr(opt, "momentum", 0.0) or 0.0) != 0.0 or getattr(opt, "nesterov", False):
        raise LaunchError(
            f"optimizer: natively, PartitionedPS trains its partitioned variables with plain SGD (Keras 3's optimizers "
            f"cannot update TensorFlow's partitioned variables), got {type(opt).__name__}; pass "
            "optimizer=lambda: keras.optimizers.SGD(learning_rate=...) or use backend='torch'"
        )


def native_payload(model: Any, x: Any, y: Any, strategy: Any, loss: Any, optimizer: Any, *, steps: int, batch: int,
                   seed: int, shuffle: bool, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """What every rank's child process needs, as bytes and arrays (built once, in the client):
    the ``.keras`` file, the data, and the job (the mode the strategy's builder maps to; for
    PartitionedPS the shards of its partitioned variables, TensorFlow's FixedShardsPartitioner)."""
    import cloudpickle

    from distlab.keras_model import keras_file

    partition = []
    if strategy.builder == "PartitionedPS":  # AutoDist's shards, as TensorFlow's partitioner sees variables: by shape
        partition = [(list(shapes[v.name]), v.partition.shards) for v in strategy.variables if v.partition is not None]
        _check_plain_sgd(optimizer)
    job = {"steps": steps, "batch": batch, "seed": seed, "shuffle": shuffle, "loss": loss, "optimizer": optimizer,
           "partition": partition}
    return {"keras": keras_file(model), "x": x, "y": y, "job": cloudpickle.dumps(job), "mode": NATIVE_BUILDERS[strategy.builder]}


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _store(master_addr: str, master_port: int, timeout: float) -> Any:
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(master_addr, master_port, is_master=False, timeout=timedelta(seconds=timeout))


def tf_config(store: Any, rank: int, world: int, run_id: str, host: str, mode: str) -> dict[str, Any]:
    """This rank's ``TF_CONFIG``: each rank publishes the ports it chose on its host (a worker
    task; in ``ps`` mode also a parameter server, and rank 0 the chief) and reads every rank's."""
    jobs = ("worker",) if mode == "mirrored" else ("worker", "ps") + (("chief",) if rank == 0 else ())
    store.set(f"tf/{run_id}/{rank}", json.dumps({job: f"{host}:{_free_port(host)}" for job in jobs}))
    mine = [json.loads(store.get(f"tf/{run_id}/{r}").decode()) for r in range(world)]
    cluster = {"worker": [m["worker"] for m in mine]}
    if mode == "mirrored":
        return {"cluster": cluster, "task": {"type": "worker", "index": rank}}
    cluster.update(ps=[m["ps"] for m in mine], chief=[mine[0]["chief"]])
    task = {"type": "chief", "index": 0} if rank == 0 else {"type": "worker", "index": rank}
    return {"cluster": cluster, "task": {**task, "rank": rank}}


def train_rank_tf(rank: int, world: int, master_addr: str, master_port: int, payload: dict[str, Any],
                  topic: str, restart: int, run_id: str, threads: int, timeout: float) -> dict[str, Any]:
    """(worker) One native TensorFlow rank: see the module's docstring."""
    from distributed import get_worker

    from distlab.launch import spmd

    worker = get_worker()
    mode = payload.get("mode", "mirrored")
    store = _store(master_addr, master_port, timeout)
    config = tf_config(store, rank, world, run_id, host_of(worker.address), mode)
    # a parameter-server rank other than the chief serves until the chief's rank says it is done
    serving = mode == "ps" and rank != 0
    done_key = f"tf/{run_id}/done"
    job_dir = Path(tempfile.mkdtemp(prefix=f"distlab-tf-{run_id}-{rank}-"))
    records: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    batch: list[dict[str, Any]] = []
    sent = [0.0]

    def emit(rec: dict[str, Any]) -> None:
        batch.append(rec)
        if not sent[0] or time.monotonic() - sent[0] >= 0.5:
            worker.log_event(topic, {"records": list(batch)})
            batch.clear()
            sent[0] = time.monotonic()

    proc = None
    stderr = None
    try:
        import numpy as np

        (job_dir / "model.keras").write_bytes(payload["keras"])
        np.savez(job_dir / "data.npz", x=payload["x"], y=payload["y"])
        (job_dir / "job.pkl").write_bytes(payload["job"])
        stderr = open(job_dir / "stderr.log", "wb")  # noqa: SIM115 - closed in finally
        proc = _start_child(job_dir, config, mode, threads, timeout, stderr)
        lines: queue.Queue[bytes | None] = queue.Queue()

        def pump() -> None:
            assert proc is not None and proc.stdout is not None
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, name=f"distlab-tf-{rank}", daemon=True).start()
        started = last = time.monotonic()
        seen = False  # any sign of life: a record, or a serving rank's "serving" line
        final: dict[str, Any] | None = None
        ended = False
        while not ended:
            try:
                line = lines.get(timeout=POLL)
            except queue.Empty:
                line = b""
            if line is None:
                ended = True
            elif line:
                text = line.decode(errors="replace").strip()
                rec = json.loads(text) if text.startswith("{") else {}
                if rec:
                    seen, last = True, time.monotonic()
                if rec.get("final"):
                    final = rec
                elif "placement" in rec:
                    details["placement"] = rec["placement"]
                elif "step" in rec:
                    rec.update(run_id=run_id, restart=restart, world=world)
                    records.append(rec)
                    emit(rec)
            if spmd.should_stop(run_id):
                return {"rank": rank, "records": records, "stopped": True, "state_dict": None}
            if serving and seen and store.check([done_key]):
                return {"rank": rank, "records": [], "state_dict": None, "stopped": False}
            waited = time.monotonic() - (last if seen else started)
            if not ended and waited > timeout and not (serving and seen):
                what = "its next step" if seen else "its first step (a peer may never have started)"
                raise LaunchError(
                    f"rank {rank}: the TensorFlow process gave no sign of {what} within {timeout:g} s; killed "
                    "(lab.launch(..., timeout=...) gives it longer)"
                )
        code = proc.wait(timeout=timeout)
        if code != 0 or final is None:
            tail = (job_dir / "stderr.log").read_text(errors="replace").strip().splitlines()[-8:]
            raise LaunchError(f"rank {rank}: the TensorFlow process exited with code {code}: " + " | ".join(tail)[-1200:])
        if records:
            records[-1]["checksum"] = final["checksum"]
        weights = None
        if rank == 0:
            with np.load(job_dir / "weights.npz") as w:
                weights = [w[f"arr_{i}"] for i in range(len(w.files))]
            if mode == "ps":
                store.set(done_key, "1")  # the serving ranks may stop
        return {"rank": rank, "records": records, "state_dict": weights, "checkpoint": None, "stopped": False,
                "details": details}
    finally:
        if batch:
            worker.log_event(topic, {"records": list(batch)})
        _kill(proc)
        if stderr is not None:
            stderr.close()
        shutil.rmtree(job_dir, ignore_errors=True)


def _start_child(job_dir: Path, config: dict[str, Any], mode: str, threads: int, timeout: float, stderr: Any) -> Any:
    """``runtime/tf_child.py`` on ``job_dir`` in its own process session (killed whole, TensorFlow's threads and all)."""
    env = {
        **os.environ,
        "TF_CONFIG": json.dumps(config),
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "DISTLAB_TF_MODE": mode,
        "DISTLAB_TF_THREADS": str(threads),
        "DISTLAB_TF_TIMEOUT": str(timeout),
        "OMP_NUM_THREADS": str(threads),
    }
    return subprocess.Popen([sys.executable, str(CHILD), str(job_dir)], stdout=subprocess.PIPE, stderr=stderr, env=env,
                            start_new_session=True)


def _kill(proc: Any) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def bench_rank_tf(rank: int, world: int, master_addr: str, master_port: int, payload: dict[str, Any], run_id: str,
                  timeout: float) -> dict[str, Any]:
    """(worker) One rank of ``lab.calibrate(backend="tensorflow")``: ``tf_child.py`` in ``bench``
    mode under ``MultiWorkerMirroredStrategy`` (see its ``bench``), killed at ``timeout``; returns its JSON line."""
    import numpy as np
    import torch
    from distributed import get_worker


    store = _store(master_addr, master_port, timeout)
    config = tf_config(store, rank, world, run_id, host_of(get_worker().address), "mirrored")
    job_dir = Path(tempfile.mkdtemp(prefix=f"distlab-tf-bench-{run_id}-{rank}-"))
    proc = None
    try:
        for i, (keras_bytes, x, y) in enumerate(payload["models"], start=1):  # model 0: the child's reference
            (job_dir / f"model{i}.keras").write_bytes(keras_bytes)
            np.savez(job_dir / f"data{i}.npz", x=x, y=y)
        (job_dir / "job.pkl").write_bytes(payload["job"])
        with open(job_dir / "stderr.log", "wb") as stderr:
            proc = _start_child(job_dir, config, "bench", torch.get_num_threads(), timeout, stderr)
            try:
                out, _ = proc.communicate(timeout=payload["deadline"])
            except subprocess.TimeoutExpired:
                raise LaunchError(
                    f"rank {rank}: TensorFlow's calibration did not finish within {payload['deadline']:g} s; killed"
                ) from None
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (job_dir / "stderr.log").read_text(errors="replace").strip().splitlines()[-8:]
            raise LaunchError(f"rank {rank}: the TensorFlow process exited with code {proc.returncode}: "
                              + " | ".join(tail)[-1200:])
        return json.loads(lines[-1])
    finally:
        _kill(proc)
        shutil.rmtree(job_dir, ignore_errors=True)


def _no_replan(survivors: list[str]) -> Any:
    raise LaunchError("native TensorFlow runs do not resize (elastic=False): relaunch on the workers there are")


def native_forecast(cm: Any, profile: Any, res: Any, st: Any) -> Any:
    """The Lab's prediction of a native run (costmodel/native.py), or None before
    ``lab.calibrate(backend="tensorflow")`` and for builders it does not predict."""
    from distlab.costmodel.compute import model_key
    from distlab.costmodel.native import predict_native
    from distlab.launch import cluster as _cluster
    from distlab.launch.run import Forecast

    if cm is None or cm.native is None:
        return None
    sub = _cluster.sub_resources(res, list(res.addresses)[: st.world])
    p = predict_native(cm.native, cm.without_refit(), profile, sub, st)
    return Forecast(p, p, profile, sub, model_key(profile)) if p is not None else None


def launch_native(lab: Any, model: Any, strategy: Any, *, steps: int, data: Any, loss: Any, optimizer: Any,
                  batch_size: int | None, shuffle: bool, seed: int, timeout: float | None) -> Any:
    """(client) ``lab.launch(..., backend="tensorflow")``: checks, profile and prediction as for a
    torch launch, then one rank per worker through ``train_rank_tf``."""
    import uuid

    from distlab.data import describe
    from distlab.launch import validate as _v
    from distlab.launch.lab import DEFAULT_BATCH, _profile
    from distlab.launch.run import Run
    from distlab.strategy.types import Strategy

    check_native(model, strategy)
    if data is None:
        raise LaunchError("backend='tensorflow': data is required: an (inputs, targets) pair of arrays")
    lab._check_idle()
    res = lab.resources
    b = batch_size or (strategy.batch.per_replica if isinstance(strategy, Strategy) else DEFAULT_BATCH)
    x, y = arrays(data)
    prof = _profile(model, b, x[:b])
    st, _ = _v.resolve_strategy(strategy, model, res, lambda n=None: prof, batch_size=b)
    if st.world > res.world:
        raise LaunchError(f"strategy: planned for {st.world} ranks but the Lab has {res.world} workers")
    check_native(model, st)
    payload = native_payload(model, x, y, st, loss, optimizer, steps=steps, batch=b, seed=seed, shuffle=shuffle,
                             shapes={v.name: v.shape for v in prof.variables})
    workers = list(res.addresses)[: st.world]
    run_id = f"r{len(lab._runs) + 1}-{uuid.uuid4().hex[:6]}"
    from distlab.runtime.job import RankJob

    job = RankJob(rank=0, world=st.world, master_addr="", master_port=0, strategy=st, model=None, steps=steps,
                  data=None, batch_size=b, seed=seed, timeout=float(timeout or lab.timeout), run_id=run_id)
    run = Run(
        lab, run_id, model, st, job, workers, lab._threads(res, workers), elastic=False,
        replan=_no_replan,
        forecast=native_forecast(lab.cost_model, prof, res, st),
        data_info=describe(data) + " (as arrays, in each TensorFlow process)",
        loss_info=getattr(loss, "name", None) or (getattr(loss, "__name__", None) if loss else "Keras default"),
        native=payload,
    )
    lab._runs.append(run)
    run._start()
    return run
