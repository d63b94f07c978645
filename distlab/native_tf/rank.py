"""(worker) One rank of a native TensorFlow run or calibration (native_tf/launch.py): the task that
``train_rank_tf`` (and ``bench_rank_tf``) runs on its pinned Dask worker, through the same SPMD
launcher as torch ranks:

1. picks a free port on its host and publishes ``host:port`` in the run's rendezvous store; reads
   every rank's, so ``TF_CONFIG`` is built from ports the workers chose themselves;
2. starts ``native_tf/child.py`` in a new process session with that ``TF_CONFIG``, reads its
   per-step JSON records and forwards them as the run's live records;
3. owns the deadlines: the child must report its first step within ``timeout`` seconds (a peer
   that never starts blocks TensorFlow's strategy constructor with no timeout of its own), and a
   step within ``timeout`` of the previous one; a stop request (cancel, a failed peer) or a
   missed deadline kills the child's whole process group. No child outlives its task: once every
   rank's child has printed its last line, each is killed rather than waited for (TensorFlow's
   own teardown took 1.2-1.4 s of each run here).

A worker that has run a TensorFlow rank keeps one spare child with TensorFlow imported, started
when the rank's task ends (``_spare``): the next rank on that worker hands it its job over stdin
instead of paying the import (about 2 s of a rank's 4 s start here). A spare costs one idle
process with TensorFlow loaded per worker (545 MB resident here, 220 MB of it its own), and exits
when its worker does (its stdin closes).
"""

from __future__ import annotations

import json
import os
import queue
import re
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

CHILD = Path(__file__).resolve().with_name("child.py")
POLL = 0.2  # seconds between checks of the child, the stop flag and the deadline

_spare_lock = threading.Lock()
_spare: dict[str, Any] = {}  # this worker's spare child: {"proc": Popen, "threads": int}


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


def train_rank_tf(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    payload: dict[str, Any],
    topic: str,
    restart: int,
    run_id: str,
    threads: int,
    timeout: float,
) -> dict[str, Any]:
    """(worker) One native TensorFlow rank: see the module's docstring.

    Long because it is one watch loop over a child process: every way out of it (a stop, the chief done, a
    missed deadline, a failure) must pass through the finally that kills the child."""
    from distributed import get_worker

    from distlab.cluster import spmd

    worker = get_worker()
    mode = payload.get("mode", "mirrored")
    store = _store(master_addr, master_port, timeout)
    config = tf_config(store, rank, world, run_id, host_of(worker.address), mode)
    # a parameter-server rank other than the chief serves until the chief's rank says it is done
    serving = mode == "ps" and rank != 0
    done_key = f"tf/{run_id}/done"
    final_key = f"tf/{run_id}/final"  # a rank's child printed its last line (mirrored: every rank's)
    finals = [f"{final_key}/{r}" for r in range(world)]
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
        proc, details["child"] = _start_child(job_dir, config, mode, threads, timeout, stderr)
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
                    store.set(f"{final_key}/{rank}", "1")
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
            if final is not None and not ended and (mode == "ps" or store.check(finals)):
                break  # every rank past its last step: TensorFlow's own teardown is not waited for
            waited = time.monotonic() - (last if seen else started)
            if not ended and waited > timeout and not (serving and seen):
                what = "its next step" if seen else "its first step (a peer may never have started)"
                raise LaunchError(
                    f"rank {rank}: the TensorFlow process gave no sign of {what} within {timeout:g} s; "
                    "killed (lab.launch(..., timeout=...) gives it longer)"
                )
        code = proc.wait(timeout=timeout) if ended else 0
        if code != 0 or final is None:
            raise LaunchError(
                f"rank {rank}: the TensorFlow process exited with code {code}: {_cause(job_dir)}"
            )
        if records:
            records[-1]["checksum"] = final["checksum"]
        weights = None
        if rank == 0:
            with np.load(job_dir / "weights.npz") as w:
                weights = [w[f"arr_{i}"] for i in range(len(w.files))]
            if mode == "ps":
                store.set(done_key, "1")  # the serving ranks may stop
        return {
            "rank": rank,
            "records": records,
            "state_dict": weights,
            "checkpoint": None,
            "stopped": False,
            "details": details,
        }
    finally:
        if batch:
            worker.log_event(topic, {"records": list(batch)})
        _kill(proc)
        if stderr is not None:
            stderr.close()
        shutil.rmtree(job_dir, ignore_errors=True)
        _start_spare(threads)


def _start_child(
    job_dir: Path, config: dict[str, Any], mode: str, threads: int, timeout: float, stderr: Any
) -> tuple[Any, str]:
    """``native_tf/child.py`` on ``job_dir`` in its own process session (killed whole, TensorFlow's
    threads and all), and how it started: this worker's spare handed the job ("spare"), or a
    fresh process writing ``stderr`` ("fresh")."""
    env = {
        "TF_CONFIG": json.dumps(config),
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "DISTLAB_TF_MODE": mode,
        "DISTLAB_TF_THREADS": str(threads),
        "DISTLAB_TF_TIMEOUT": str(timeout),
        "OMP_NUM_THREADS": str(threads),
    }
    spare = _take_spare(threads)
    if spare is not None:
        job = {"job_dir": str(job_dir), "stderr": str(job_dir / "stderr.log"), "env": env}
        try:
            spare.stdin.write(json.dumps(job).encode() + b"\n")
            spare.stdin.close()
            spare.stdin = None  # as a fresh child's: communicate() has nothing to send or close
            return spare, "spare"
        except OSError:  # it died since (killed, out of memory): a fresh one instead
            _kill(spare)
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(job_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        env={**os.environ, **env},
        start_new_session=True,
    ), "fresh"


def _take_spare(threads: int) -> Any:
    """This worker's spare child, alive and started for ``threads`` threads, or None (a spare
    started for another thread count is killed: its OpenMP settings were read at its import)."""
    with _spare_lock:
        proc, wanted = _spare.pop("proc", None), _spare.pop("threads", None)
    if proc is not None and (proc.poll() is not None or wanted != threads):
        _kill(proc)
        return None
    return proc


def _start_spare(threads: int) -> None:
    """After a rank's task: a spare child for this worker's next TensorFlow rank, unless one is
    waiting already. It imports TensorFlow now, while the worker is idle or running torch ranks
    (it uses a core for about 2 s), then blocks on its stdin until a job comes or the worker exits."""
    with _spare_lock:
        old = _spare.get("proc")
        if old is not None and old.poll() is None and _spare.get("threads") == threads:
            return
        _kill(old)
        env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
        env["OMP_NUM_THREADS"] = str(threads)
        try:
            proc = subprocess.Popen(
                [sys.executable, str(CHILD), "--spare"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError:  # no process to spare (out of memory, a limit): the next rank starts its own
            _spare.clear()
            return
        _spare.update(proc=proc, threads=threads)


def _kill(proc: Any) -> None:
    if proc is not None and proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def bench_rank_tf(
    rank: int,
    world: int,
    master_addr: str,
    master_port: int,
    payload: dict[str, Any],
    run_id: str,
    timeout: float,
) -> dict[str, Any]:
    """(worker) One rank of ``lab.calibrate(backend="tensorflow")``: ``native_tf/child.py`` in ``bench``
    mode under ``MultiWorkerMirroredStrategy`` (see its ``bench``), killed at ``timeout``; returns its JSON
    line."""
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
            proc, _ = _start_child(job_dir, config, "bench", torch.get_num_threads(), timeout, stderr)
            try:
                out, _ = proc.communicate(timeout=payload["deadline"])
            except subprocess.TimeoutExpired:
                raise LaunchError(
                    f"rank {rank}: TensorFlow's calibration did not finish within {payload['deadline']:g} s; "
                    "killed"
                ) from None
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise LaunchError(
                f"rank {rank}: the TensorFlow process exited with code {proc.returncode}: {_cause(job_dir)}"[
                    -1200:
                ]
            )
        return json.loads(lines[-1])
    finally:
        _kill(proc)
        shutil.rmtree(job_dir, ignore_errors=True)
        _start_spare(torch.get_num_threads())


def _cause(job_dir: Path) -> str:
    """The TensorFlow child's error in one line: the last line of its stderr that names an
    exception (the traceback's end), else its last line; the whole log stays in ``job_dir``."""
    lines = [
        ln.strip() for ln in (job_dir / "stderr.log").read_text(errors="replace").splitlines() if ln.strip()
    ]
    named = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b", ln)]
    last = (named or lines or ["(no output)"])[-1]
    return f"{last[:600]} (log: {job_dir / 'stderr.log'})"
