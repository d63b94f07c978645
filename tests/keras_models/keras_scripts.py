"""Keras code for the tests, run in a process of its own per backend (Keras fixes its backend at
its first import in a process): ``run(backend, function_name, *args)`` returns the function's
JSON-able result. The tests run every scenario of a backend in one process on one shared Lab
(``several`` with ``TORCH_CALLS`` or ``TENSORFLOW_CALLS``; conftest.py), each asserting on its own
result (``result``); a scenario run alone (``run(backend, name, ...)``) starts its own Lab."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


BUILDERS = ["PS", "PartitionedPS", "Parallax", "Gossip", "AdaptiveBatch"]
# launch(timeout=) of the run whose rank never starts: the whole wait is this deadline, idle, and any
# deadline fails it the same way (both ranks' children are then past their start or stopped)
NEVER_DEADLINE = 8

# the notebook on torch: distlab's runtime and the native route (first: the torch route's check
# that its workers never import TensorFlow)
TORCH_CALLS = [
    ["profile", "profile_facts", []],
    ["torch_equivalence", "torch_route_equivalence", ["AllReduce"]],
    ["conventions", "keras_conventions_match", []],
    ["optimizers_on_both_routes", "keras_optimizers_on_both_routes", []],
    ["user_flow", "keras_user_flow", [200, "torch"]],
    ["native_under_load", "native_calibration_under_load", []],
    ["native_equivalence", "torch_route_equivalence", ["AllReduce", 4, 8, "tensorflow"]],
    ["native_exit_AllReduce", "native_faults", ["exit", "AllReduce"]],
    ["native_never", "native_faults", ["never", "AllReduce", NEVER_DEADLINE]],
    ["native_bad_input", "native_bad_input", []],
    ["native_ps", "native_ps", [["PS", "PartitionedPS"]]],
]
# the notebook on TensorFlow (a plain ``import keras``)
TENSORFLOW_CALLS = [
    ["profile", "profile_facts", []],
    ["builders", "torch_route_builders", [BUILDERS]],
    ["user_flow_tensorflow", "keras_user_flow", [200, "tensorflow"]],
    ["user_flow_torch", "keras_user_flow", [200, "torch"]],
    ["fit_guard", "keras_fit_multi_worker", []],
    # the native route from a notebook whose Keras runs on TensorFlow (the torch notebook's native
    # scenarios cover the other backend); here, as the longest, it evens the two processes' seconds
    ["native_mirrored", "native_allreduce", [30, True]],
    # here rather than beside its AllReduce twin: the torch notebook's scenarios took 108 s and
    # these 90 (2026-11-29), and the two processes run at once, so the longer one is the wait
    ["native_exit_PS", "native_faults", ["exit", "PS"]],
    ["native_spare", "native_spare", []],
]
TIMEOUT = 900  # seconds for one process's scenarios (about 300 s here); the tests' marks allow it

_SHARED: dict = {}  # several(): the one 2-worker Lab every scenario of the call uses


def _lab(workers: int = 2, cache_dir: str | None = None):
    """A scenario's Lab: the shared one inside ``several`` (its cache folder set), else its own."""
    import distlab as dl

    lab = _SHARED.get(workers)
    if lab is None or lab.closed:
        return dl.Lab(workers=workers, cache_dir=cache_dir)
    lab.cache_dir = Path(cache_dir) if cache_dir else lab.cache_dir
    return lab


def _done(lab) -> None:
    """A scenario's end: its own Lab closed; the shared one kept for the next, as it started
    (no cost model, its own cache folder)."""
    if all(lab is not shared for shared in _SHARED.values()):
        lab.close()
        return
    lab.cost_model = None
    lab.cache_dir = _SHARED["cache_dir"]


def several(calls: list) -> dict:
    """Each ``[key, function_name, args]`` of ``calls`` in this one process, on one shared Lab of
    2 workers (a process start, Keras's import and a Lab's start cost seconds each):
    ``{key: result}``, a failed call's result ``{"failed": its traceback}``."""
    import time
    import traceback

    import distlab as dl

    out: dict = {"seconds": {}}  # each call's, for whoever trims the suite
    _SHARED[2] = dl.Lab(workers=2)
    _SHARED["cache_dir"] = _SHARED[2].cache_dir
    try:
        for key, name, args in calls:
            t0 = time.monotonic()
            try:
                out[key] = globals()[name](*args)
            except Exception:  # noqa: BLE001 - the test of this call reports it
                out[key] = {"failed": traceback.format_exc()[-4000:]}
            out["seconds"][key] = round(time.monotonic() - t0, 1)
    finally:
        out["spares_at_close"] = _close_and_see_spares_end(_SHARED.pop(2))
        _SHARED.clear()
    return out


def result(out: dict, key: str) -> dict:
    """One call's result of ``several``; its traceback when it failed."""
    assert key in out, f"{key}: not run"
    assert "failed" not in out[key], f"{key} failed:\n{out[key]['failed']}"
    return out[key]


def start(backend: str, name: str, *args) -> subprocess.Popen:
    """``name(*args)`` started in a process of its own on Keras ``backend``; ``finish`` reads its result."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(HERE)}
    code = f"import json, keras_scripts as k; print('RESULT ' + json.dumps(k.{name}(*{list(args)!r})))"
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen, what: str, timeout: float = 240) -> dict:
    """The result of a process ``start`` began, killed past ``timeout`` seconds."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"{what} did not finish within {timeout:g} s:\n{stderr[-3000:]}") from None
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{what} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def run(backend: str, name: str, *args, timeout: float = 240) -> dict:
    """``name(*args)`` in a process of its own on Keras ``backend``: its result."""
    return finish(start(backend, name, *args), f"{name} under {backend}", timeout)


def mlp(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    keras.backend.clear_session()
    return keras.Sequential(
        [keras.Input((12,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(5)], name="mlp"
    )


def embedding_model():
    import keras

    keras.backend.clear_session()
    ids = keras.Input((6,), dtype="int32")
    h = keras.layers.Embedding(100, 8, name="table")(ids)
    h = keras.layers.GlobalAveragePooling1D()(h)
    return keras.Model(ids, keras.layers.Dense(3, name="head")(h), name="emb")


def profile_facts() -> dict:
    """The profile of an MLP and of an embedding model, as the tests read it."""
    import numpy as np

    import distlab as dl

    batch = 8
    p = dl.profile(mlp(), sample_input=np.zeros((1, 12), "float32"), batch_size=batch)
    e = dl.profile(embedding_model(), sample_input=np.zeros((2, 6), "int32"), batch_size=batch)
    return {
        "backend": p.meta["backend"],
        "layers": [
            (layer.name, layer.kind, layer.flops_fwd, layer.flops_bwd, layer.params) for layer in p.layers
        ],
        "variables": [(v.name, list(v.shape), v.sparse, v.embedding, v.layer) for v in p.variables],
        "grad_ready_order": list(p.grad_ready_order),
        "step_time": p.step_time,
        "layer_time_sum": sum(layer.time_fwd + layer.time_bwd for layer in p.layers),
        "emb_variables": [(v.name, v.sparse, v.embedding) for v in e.variables],
        "emb_layers": [(layer.name, layer.kind, layer.flops_fwd) for layer in e.layers],
        "input_spec": e.input_spec,
    }


def torch_route_equivalence(
    builder: str = "AllReduce", steps: int = 4, per_replica: int = 8, backend: str = "torch"
) -> dict:
    """A Keras MLP trained by the Lab on 2 ranks (``backend``: distlab's torch runtime, or
    TensorFlow's own natively) and by one process (torch) on the global batch: their final
    weights, and what the run reports. SGD at 0.1 on both."""
    import numpy as np
    import torch

    from distlab.keras_model import wrap

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 12)).astype("float32")
    y = rng.integers(0, 5, size=256).astype("int64")

    def sgd(params):
        return torch.optim.SGD(params, lr=0.1)

    lab = _lab(2)
    try:
        model = mlp(seed=1)
        run = lab.launch(
            model,
            strategy=builder,
            steps=steps,
            data=(x, y),
            optimizer=sgd if backend == "torch" else "sgd",
            lr=None if backend == "torch" else 0.1,
            batch_size=per_replica,
            shuffle=False,
            backend=backend,
        )
        run.wait(timeout=180)
        trained = run.model
        # Keras's saving imports TensorFlow when it can; distlab's loading on the workers does not
        # (the notebook's own keras.utils.set_random_seed above imports it here)
        on_workers = lab.client.run(lambda: "tensorflow" in sys.modules)
        out = {
            "tensorflow_on_workers": list(on_workers.values()),
            "status": run.status,
            "type": type(trained).__module__.split(".")[0] + "." + type(trained).__name__,
            "strategy": run.strategy.name,
            "losses": list(run.losses.iloc[[0, -1]]),
            "untouched": [w.tolist() for w in model.get_weights()]
            == [w.tolist() for w in mlp(seed=1).get_weights()],
        }
    finally:
        _done(lab)
    ref = wrap(mlp(seed=1))
    opt = sgd(ref.parameters())
    g = 2 * per_replica
    for step in range(steps):
        xb, yb = torch.as_tensor(x[step * g : (step + 1) * g]), torch.as_tensor(y[step * g : (step + 1) * g])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(xb), yb).backward()
        opt.step()
    diffs = [float(np.abs(a - b).max()) for a, b in zip(trained.get_weights(), ref.keras_model.get_weights())]
    out["max_weight_difference"] = max(diffs)
    out["moved"] = max(
        float(np.abs(a - b).max()) for a, b in zip(trained.get_weights(), mlp(seed=1).get_weights())
    )
    return out


def torch_route_builders(builders: list) -> dict:
    """One short run of a Keras embedding model per builder on 2 ranks: status, loss, and whether
    run.model holds the trained weights."""
    import numpy as np

    import distlab as dl

    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, size=(256, 6)).astype("int32")
    y = rng.integers(0, 3, size=256).astype("int64")
    lab = _lab(2)
    out = {}
    try:
        model = embedding_model()
        prof = dl.profile(model, sample_input=x[:8], batch_size=8)
        out["variables"] = [v.name for v in prof.variables]
        for name in builders:
            st = dl.strategy.build(name, prof, lab.resources, batch_size=8)
            run = lab.launch(model, strategy=st, steps=6, data=(x, y))
            run.wait(timeout=180)
            first, last = run.losses.iloc[[0, -1]]
            out[name] = {
                "status": run.status,
                "first": first,
                "last": last,
                "keras": hasattr(run.model, "get_weights"),
                "world": run.world,
            }
        # a worker whose Keras runs on TensorFlow (a script's top-level import) gets the model's
        # file unopened: it pickles on unchanged (the scheduler's case) and a rank using it fails
        import pickle

        from distlab.errors import LaunchError
        from distlab.keras_model import as_module

        foreign = pickle.loads(pickle.dumps(as_module(model)))
        out["foreign_passes_on"] = pickle.loads(pickle.dumps(foreign)).data == foreign.data
        try:
            foreign.parameters()
        except LaunchError as exc:
            out["foreign_error"] = str(exc)
        # the magics profile the same model on a batch of its data, on the notebook's backend
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        shell.run_line_magic("load_ext", "distlab")
        shell.user_ns.update(net=model, train=(x, y))
        shell.run_line_magic("distlab", "profile net --data train -o prof")
        prof = shell.user_ns.get("prof")
        out["magics_profile"] = None if prof is None else [v.name for v in prof.variables]
        # a Keras zoo model on synthetic data drawn from its specs (no data=)
        zoo = dl.zoo.get("keras_embedding", rows=500)
        run = lab.launch(zoo, strategy="AllReduce", steps=4, batch_size=8)
        run.wait(timeout=180)
        out["zoo"] = {"status": run.status, "data": run.data_info, "model": lab.runs["model"].iloc[-1]}
    finally:
        _done(lab)
    return out


def native_allreduce(steps: int = 30, twice: bool = True) -> dict:
    """A Keras MLP trained natively (MultiWorkerMirroredStrategy) on 2 workers, twice on the same
    workers: per run, the status, the first and last loss, each rank's weight checksum, and what
    lab.runs says."""
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 12)).astype("float32")
    y = (x[:, :5].argmax(1)).astype("int64")
    import tempfile
    import warnings

    from distlab import resources

    # a busy CI host would mark the measurement disturbed, which is never cached; this script tests
    # the cache (native_calibration_under_load tests the disturbed branch)
    disturbed_cores, resources.DISTURBED_CORES = resources.DISTURBED_CORES, float("inf")
    cache = tempfile.mkdtemp(prefix="distlab-native-cache-")
    lab = _lab(2, cache_dir=cache)
    out = {"runs": []}
    try:
        model = mlp(seed=2)
        # TensorFlow's side measured for the predictions, then read back from the cache
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = lab.calibrate(
                backend="tensorflow", models=[(model, (x, y))], batch_size=16, progress=False
            ).native
            again = lab.calibrate(
                backend="tensorflow", models=[(model, (x, y))], batch_size=16, progress=False
            ).native
        out["calibration"] = {
            "native": first.to_dict(),
            "cached": again == first,
            "disturbed": any("calibrate" in str(w.message) for w in caught),
            "files": [f.name for f in Path(cache).glob("native-*.json")],
        }
        for _ in range(2 if twice else 1):
            t0 = time.perf_counter()
            run = lab.launch(
                model, strategy="AllReduce", steps=steps, data=(x, y), batch_size=16, backend="tensorflow"
            )
            run.wait(timeout=240)
            m = run.metrics
            last = m[m.step == m.step.max()]
            out["runs"].append(
                {
                    "status": run.status,
                    "seconds": time.perf_counter() - t0,
                    "losses": list(run.losses.iloc[[0, -1]]),
                    "checksums": sorted(last["checksum"].tolist()),
                    "throughput": run.throughput,
                    "model_type": type(run.model).__name__,
                    "weights": float(sum(float(np.abs(w).sum()) for w in run.model.get_weights())),
                    "backend": lab.runs["backend"].iloc[-1],
                    "world": run.world,
                    "predicted": run.predicted_throughput,
                    "refitted": lab.runs["refitted_throughput"].iloc[-1],
                    "prediction": run.forecast.prediction.strategy,
                    "detail": run.forecast.prediction.detail,
                }
            )
    finally:
        resources.DISTURBED_CORES = disturbed_cores
        _done(lab)
    return out


def _children(run_id: str, rank: int | None = None) -> list:
    """The TensorFlow processes of ``run_id`` (of its rank ``rank``), found by their log: fd 2 is
    ``stderr.log`` in the rank's job folder ``distlab-tf-{run_id}-{rank}-*`` whether the process was
    started for the rank (its command line names the folder too) or was its worker's spare."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline"]):
        if "native_tf/child.py" not in " ".join(p.info["cmdline"] or []):
            continue
        try:
            log = os.readlink(f"/proc/{p.pid}/fd/2")
        except OSError:  # gone meanwhile
            continue
        if f"distlab-tf-{run_id}-" in log and (rank is None or f"-{run_id}-{rank}-" in log):
            out.append(p)
    return out


def _spares(worker_pids) -> list[int]:
    """The spare TensorFlow processes (``child.py --spare``) the given worker processes started."""
    import psutil

    return sorted(
        p.pid
        for p in psutil.process_iter(["cmdline", "ppid"])
        if p.info["ppid"] in set(worker_pids) and "--spare" in (p.info["cmdline"] or [])
    )


def native_spare() -> dict:
    """Two short native runs on the shared Lab: after each, every worker keeps a spare TensorFlow
    process; the second run's rank 0 starts in its worker's spare, and the spares the first run
    left are used up by the second (``several`` checks that closing the Lab ends the last ones)."""
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 12)).astype("float32")
    y = rng.integers(0, 5, size=256).astype("int64")
    lab = _lab(2)
    out: dict = {"runs": []}
    try:
        pids = list(lab.client.run(os.getpid).values())
        for _ in range(2):
            run = lab.launch(mlp(), steps=3, data=(x, y), batch_size=8, backend="tensorflow", block=True)
            deadline = time.monotonic() + 10  # started as each rank's task ends
            while len(_spares(pids)) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            out["runs"].append(
                {"status": run.status, "child": run.details.get("child"), "spares": _spares(pids)}
            )
    finally:
        _done(lab)
    return out


def _close_and_see_spares_end(lab) -> dict:
    """Close ``lab``: its workers' spare TensorFlow processes before, and those still running 20 s
    after (a spare's stdin closes with its worker; one still importing TensorFlow ends after)."""
    import time

    import psutil

    def running(pid: int) -> bool:  # an orphan's zombie, left to a container's init, has ended
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    try:
        spares = _spares(list(lab.client.run(os.getpid).values()))
    finally:
        lab.close()
    left, deadline = spares, time.monotonic() + 20
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if running(p)]
    return {"before": spares, "left": left}


def _no_children_within(run_id: str, seconds: float) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _children(run_id):
            return True
        time.sleep(0.2)
    return False


def native_faults(kind: str, builder: str = "AllReduce", deadline: float = 20) -> dict:
    """A native run (``builder``, ``launch(timeout=deadline)``) on 2 workers whose rank 1 process is
    killed after its first steps ("exit"), or stopped before its first step so that it never starts
    ("never"): how the run ends."""
    import signal
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 12)).astype("float32")
    y = rng.integers(0, 5, size=512).astype("int64")
    lab = _lab(2)
    try:
        run = lab.launch(
            mlp(),
            strategy=builder,
            steps=100000,
            data=(x, y),
            batch_size=8,
            backend="tensorflow",
            timeout=deadline,
        )
        deadline = time.monotonic() + 120
        victim = []
        while not victim and time.monotonic() < deadline:
            if kind == "exit" and len(run.metrics) == 0:
                time.sleep(0.1)
                continue
            victim = _children(run.id, 1)
            time.sleep(0.05)
        if not victim:
            return {"error": "no child process of rank 1 seen"}
        t0 = time.monotonic()
        victim[0].send_signal(signal.SIGKILL if kind == "exit" else signal.SIGSTOP)
        while not run.done and time.monotonic() - t0 < 120:
            time.sleep(0.1)
        out = {"status": run.status, "seconds": time.monotonic() - t0, "error": str(run.error)}
        out["no_children"] = _no_children_within(run.id, 15)
        return out
    finally:
        _done(lab)


def native_bad_input() -> dict:
    """The errors of a native launch given what it cannot run."""
    import os

    import numpy as np
    import torch

    from distlab.errors import DistlabError

    x, y = np.zeros((64, 12), "float32"), np.zeros(64, "int64")
    lab = _lab(1)
    out = {}

    def attempt(key, **kw):
        try:
            args = {
                "model": mlp(),
                "strategy": "AllReduce",
                "steps": 2,
                "data": (x, y),
                "backend": "tensorflow",
                **kw,
            }
            lab.launch(**args)
            out[key] = None
        except DistlabError as exc:
            out[key] = f"{type(exc).__name__}: {exc}"

    try:
        attempt("torch_model", model=torch.nn.Linear(12, 5))
        attempt("gossip", strategy="Gossip")
        attempt("no_data", data=None)
        attempt("unknown_backend", backend="jax")
        os.environ["TF_CONFIG"] = "{}"
        attempt("tf_config")
        del os.environ["TF_CONFIG"]
        for key, kw in {
            "calibrate_torch_model": {"models": [torch.nn.Linear(12, 5)]},
            "calibrate_one_worker": {"models": [(mlp(), (x, y))]},
            "calibrate_no_data": {"models": [mlp()]},
            "calibrate_backend": {"backend": "jax"},
        }.items():
            try:
                lab.calibrate(**{"backend": "tensorflow", **kw})
                out[key] = None
            except DistlabError as exc:
                out[key] = f"{type(exc).__name__}: {exc}"
    finally:
        _done(lab)
    return out


def keras_fit_multi_worker() -> dict:
    """Keras 3's own fit under MultiWorkerMirroredStrategy with two worker processes (no distlab):
    each process's exit code and the last line of its error."""
    import json
    import os
    import socket
    import subprocess
    import sys

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    code = (
        "import os, numpy as np, tensorflow as tf\nstrategy = "
        "tf.distribute.MultiWorkerMirroredStrategy()\nimport keras\nwith strategy.scope():\n    m = "
        "keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])\n    m.compile(optimizer='sgd', "
        "loss='mse')\nm.fit(np.zeros((64, 4), 'float32'), np.zeros((64, 2), 'float32'), batch_size=16, "
        "epochs=1, verbose=0)\n"
    )
    procs = []
    for i in range(2):
        env = {
            **os.environ,
            "KERAS_BACKEND": "tensorflow",
            "TF_CPP_MIN_LOG_LEVEL": "3",
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                    "task": {"type": "worker", "index": i},
                }
            ),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    out = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=120)
            out.append({"code": p.returncode, "error": (err.strip().splitlines() or [""])[-1][:300]})
        except subprocess.TimeoutExpired:
            p.kill()
            out.append({"code": None, "error": "hung for 120 s"})
    return {"workers": out}


def native_ps(builders: list, steps: int = 20) -> dict:
    """An embedding model trained natively under ParameterServerStrategy on 2 workers (each hosting
    a worker and a parameter-server task; rank 0 also the chief), per builder: status, losses,
    where each variable's shards were placed."""
    import numpy as np

    import distlab as dl

    rng = np.random.default_rng(0)
    x = rng.integers(0, 1000, size=(1024, 6)).astype("int32")
    y = (x[:, 0] % 3).astype("int64")
    lab = _lab(2)
    out = {}
    try:
        import keras

        keras.backend.clear_session()
        ids = keras.Input((6,), dtype="int32")
        h = keras.layers.Flatten()(keras.layers.Embedding(1000, 16, name="table")(ids))
        model = keras.Model(ids, keras.layers.Dense(3, name="head")(h), name="ps_model")
        prof = dl.profile(model, sample_input=x[:8], batch_size=16)
        for builder in builders:
            st = dl.strategy.build(builder, prof, lab.resources, batch_size=16)
            run = lab.launch(
                model,
                strategy=st,
                steps=steps,
                data=(x, y),
                backend="tensorflow",
                timeout=90,
                optimizer=lambda: keras.optimizers.SGD(learning_rate=0.5),
            )
            run.wait(timeout=300)
            out[builder] = {
                "status": run.status,
                "losses": list(run.losses.iloc[[0, -1]]),
                "placement": run.details.get("placement"),
                "model": type(run.model).__name__,
                "steps": int(run.metrics.step.max()) + 1,
                "shards": {v.name: (v.partition.shards if v.partition else 1) for v in st.variables},
            }
        # partitioned shards step by plain SGD after the optimizer's weight decay, as Keras
        # applies it: every step of each worker multiplies the table by 1 - wd * lr (rows without
        # a gradient too), next to which the gradients barely move its L1 norm
        start = float(np.abs(model.get_weights()[0]).sum())
        run = lab.launch(
            model,
            strategy="PartitionedPS",
            steps=4,
            data=(x, y),
            backend="tensorflow",
            timeout=90,
            optimizer=keras.optimizers.SGD(learning_rate=0.1, weight_decay=0.5),
        )
        run.wait(timeout=300)
        out["decay"] = {
            "status": run.status,
            "error": str(run.error or ""),
            "steps": int(run.metrics.step.max()) + 1 if run.status == "finished" else 0,
            "table_l1_ratio": float(np.abs(run.model.get_weights()[0]).sum()) / start
            if run.status == "finished"
            else None,
        }
        try:  # natively, partitioned variables train with plain SGD only
            lab.launch(
                model,
                strategy="PartitionedPS",
                steps=2,
                data=(x, y),
                backend="tensorflow",
                optimizer=lambda: keras.optimizers.Adam(),
            )
            out["adam"] = None
        except dl.DistlabError as exc:
            out["adam"] = str(exc)
    finally:
        _done(lab)
    return out


def native_calibration_under_load() -> dict:
    """calibrate(backend="tensorflow") beside two busy processes: the warnings it gives and the
    cache files it leaves."""
    import tempfile
    import warnings

    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 12)).astype("float32")
    y = (x[:, :5].argmax(1)).astype("int64")
    cache = tempfile.mkdtemp(prefix="distlab-native-load-")
    lab = _lab(2, cache_dir=cache)
    spin = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"  # gone with this process
    hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cm = lab.calibrate(
                backend="tensorflow", models=[(mlp(seed=2), (x, y))], batch_size=16, progress=False
            )
        return {
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
            "files": [f.name for f in Path(cache).glob("native-*.json")],
            "native": cm.native is not None,
        }
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        _done(lab)


def keras_conventions_match() -> dict:
    """(torch backend) distlab's KerasLoss against Keras's own losses on the same tensors; Keras
    optimizers' five steps against the torch route's translation and the native route's rebuilt
    Keras optimizer (distlab.conventions); the settings neither route carries, refused."""
    import keras
    import numpy as np
    import torch

    from distlab.conventions import keras_loss, optimizer_spec, resolve

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((8, 5)).astype("float32")
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = rng.integers(0, 5, 8)
    onehot = np.eye(5, dtype="float32")[y]
    b = rng.integers(0, 2, (8, 1)).astype("float32")
    reg, t = rng.standard_normal((8, 3)).astype("float32"), rng.standard_normal((8, 3)).astype("float32")
    L = keras.losses
    cases = {
        "SCCE(from_logits)": (L.SparseCategoricalCrossentropy(from_logits=True), logits, y),
        "SCCE()": (L.SparseCategoricalCrossentropy(), probs, y),
        "SCCE(ignore_class=2)": (
            L.SparseCategoricalCrossentropy(from_logits=True, ignore_class=2),
            logits,
            y,
        ),
        "name": ("sparse_categorical_crossentropy", probs, y),
        "function": (L.sparse_categorical_crossentropy, probs, y),
        "CCE(label_smoothing)": (L.CategoricalCrossentropy(label_smoothing=0.1), probs, onehot),
        "CCE(from_logits)": (L.CategoricalCrossentropy(from_logits=True), logits, onehot),
        "BCE(from_logits)": (L.BinaryCrossentropy(from_logits=True), logits[:, :1], b),
        "BCE(label_smoothing)": (
            L.BinaryCrossentropy(label_smoothing=0.2),
            1 / (1 + np.exp(-logits[:, :1])),
            b,
        ),
        "mse": ("mse", reg, t),
        "mae": ("mae", reg, t),
        "Huber(delta)": (L.Huber(delta=0.5), reg, t),
    }
    losses = {}
    for name, (loss, o, tt) in cases.items():
        fn = L.get(loss) if isinstance(loss, str) else loss
        ref = float(np.mean(keras.ops.convert_to_numpy(fn(tt, o))))
        mine = float(keras_loss(loss)(torch.tensor(o), torch.tensor(tt)))
        losses[name] = [ref, mine]
    optimizers = {}
    opts = keras.optimizers
    # gradients of size 1e-4, where epsilon's place shows (a 3x different step for RMSprop), and
    # rates that move the weights far more than the tolerance; "scaled": fit's gradients of a
    # loss multiplied by loss_scale_factor, which Keras's apply divides back
    cases = {
        "Adam": (opts.Adam(learning_rate=0.01), False),
        "Adam(weight_decay=1e-4)": (opts.Adam(weight_decay=1e-4), False),
        "Adam(weight_decay=0.5)": (opts.Adam(learning_rate=0.01, weight_decay=0.5), False),
        "Adam(amsgrad)": (opts.Adam(learning_rate=0.01, amsgrad=True), False),
        "Adam(loss_scale_factor=128)": (opts.Adam(learning_rate=0.01, loss_scale_factor=128.0), True),
        "AdamW": (opts.AdamW(learning_rate=0.01, weight_decay=0.1), False),
        "SGD(nesterov)": (opts.SGD(learning_rate=100.0, momentum=0.9, nesterov=True), False),
        "SGD(weight_decay=1e-3)": (opts.SGD(learning_rate=100.0, momentum=0.5, weight_decay=1e-3), False),
        "RMSprop(epsilon=1e-7)": (opts.RMSprop(learning_rate=0.01, epsilon=1e-7), False),
        "RMSprop(momentum, centered)": (opts.RMSprop(learning_rate=0.01, momentum=0.5, centered=True), False),
        "RMSprop(weight_decay=0.1)": (opts.RMSprop(learning_rate=0.01, weight_decay=0.1), False),
        "Adagrad": (opts.Adagrad(learning_rate=0.01, initial_accumulator_value=0.0), False),
        "Adagrad(weight_decay=0.1)": (opts.Adagrad(learning_rate=0.01, weight_decay=0.1), False),
    }
    start = rng.uniform(0.5, 1.5, 4).astype("float32")
    grads = [1e-4 * rng.standard_normal(4).astype("float32") for _ in range(5)]

    def keras_steps(opt, scaled):
        v = keras.Variable(start.copy())
        for g in grads:
            opt.apply_gradients([(keras.ops.convert_to_tensor(g * (128.0 if scaled else 1.0)), v)])
        return keras.ops.convert_to_numpy(v).tolist()

    for name, (opt, scaled) in cases.items():
        spec = optimizer_spec(opt)
        p = torch.nn.Parameter(torch.tensor(start))
        torch_opt = spec([p])
        for g in grads:
            p.grad = torch.tensor(g)
            torch_opt.step()
        cfg = opt.get_config()
        optimizers[name] = {
            "keras": keras_steps(opt.from_config(cfg), scaled),
            "torch": p.detach().tolist(),  # the torch route
            # the native route's rebuilt optimizer, on the gradients of its unscaled loss
            "native": keras_steps(spec.keras(), False),
            # the same without its weight decay, or torch's own rule: what a route that dropped
            # the decay or kept torch's epsilon would give (the check can fail)
            "without_decay": keras_steps(opt.from_config({**cfg, "weight_decay": 0.0}), scaled),
            "describe": spec.describe(),
        }
    refused = {}
    for key, value in (
        ("clipnorm", 1.0),
        ("clipvalue", 1.0),
        ("global_clipnorm", 1.0),
        ("use_ema", True),
        ("gradient_accumulation_steps", 2),
    ):
        try:
            optimizer_spec(opts.Adam(**{key: value}))
            refused[key] = None
        except Exception as e:  # noqa: BLE001 - the test reads the message
            refused[key] = f"{type(e).__name__}: {e}"
    excluded = opts.AdamW()
    excluded.exclude_from_weight_decay(var_names=["bias"])
    try:
        optimizer_spec(excluded)
        refused["exclude_from_weight_decay"] = None
    except Exception as e:  # noqa: BLE001
        refused["exclude_from_weight_decay"] = f"{type(e).__name__}: {e}"
    # loss_scale_factor: fit's scaling and unscaling cancel for float32 layers (taken), not for others
    mixed = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, dtype="mixed_float16")])
    try:
        resolve(mixed, "mse", opts.Adam(loss_scale_factor=128.0))
        refused["loss_scale_factor"] = None
    except Exception as e:  # noqa: BLE001
        refused["loss_scale_factor"] = f"{type(e).__name__}: {e}"
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    plain.compile(optimizer=opts.Adam(loss_scale_factor=128.0), loss="mse")
    scaled_info = resolve(plain, None, None).optimizer_info
    return {"losses": losses, "optimizers": optimizers, "refused": refused, "scaled_info": scaled_info}


def _ids_model(softmax: bool):
    import keras

    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    return keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            keras.layers.Embedding(500, 8),
            keras.layers.Flatten(),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(4, activation="softmax" if softmax else None),
        ]
    )


def _digits_classifier():
    import keras

    keras.utils.set_random_seed(0)
    keras.backend.clear_session()
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def keras_user_flow(steps: int = 200, route: str | None = None) -> dict:
    """What a Keras user does, on this process's Keras backend, through ``route`` (distlab's
    "torch" runtime or the native "tensorflow" one; by default the route of the notebook's
    backend): the ids model trained with a Keras loss name (softmax output) and
    a loss object (logits), no optimizer; then a compiled softmax classifier launched with no loss
    or optimizer against ``model.fit`` over the same samples, scored on held-out digits."""
    import keras
    import numpy as np
    from sklearn.datasets import load_digits

    backend = keras.backend.backend()
    route = route or backend
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 500, (2048, 6)).astype("int32")
    label = (ids[:, 0] % 4).astype("int64")
    x, yd = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    perm = rng.permutation(len(x))
    train, test = perm[:1400], perm[1400:]
    out: dict = {"backend": backend}
    lab = _lab(2)
    try:
        for name, softmax, loss in (
            ("name", True, "sparse_categorical_crossentropy"),
            ("object", False, keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
        ):
            run = lab.launch(
                _ids_model(softmax),
                steps=steps,
                data=(ids, label),
                loss=loss,
                optimizer="adam",
                lr=0.01,
                batch_size=16,
                backend=route,
                block=True,
            )
            out[name] = {
                "status": run.status,
                "losses": list(run.losses.iloc[[0, -1]]),
                "loss_info": run.loss_info,
                "optimizer_info": run.optimizer_info,
            }
        model = _digits_classifier()
        before = model.get_weights()
        run = lab.launch(
            model, steps=steps, data=(x[train], yd[train]), batch_size=16, backend=route, block=True
        )
        trained = run.model
        out["trained_library"] = type(trained).__module__.split(".")[0]
        out["user_model_untouched"] = all((a == b).all() for a, b in zip(model.get_weights(), before))
        acc = float(np.mean(np.argmax(trained.predict(x[test], verbose=0), 1) == yd[test]))
        out["compiled"] = {
            "status": run.status,
            "accuracy": acc,
            "loss_info": run.loss_info,
            "optimizer_info": run.optimizer_info,
            "error": str(run.error or ""),
            "metric_names": run.metric_names,
            # compile's metric per step: the training batches' accuracy over the last 50 steps
            "train_accuracy": float(run.metrics.groupby("step")["accuracy"].mean().iloc[-50:].mean())
            if "accuracy" in run.metrics
            else None,
            "card": run._repr_html_(),
        }
    finally:
        _done(lab)
    ref = _digits_classifier()
    epochs = -(-steps * 32 // len(train))
    ref.fit(x[train], yd[train], batch_size=32, epochs=epochs, verbose=0, shuffle=True)
    out["fit_accuracy"] = float(np.mean(np.argmax(ref.predict(x[test], verbose=0), 1) == yd[test]))
    out["fit_steps"] = epochs * -(-len(train) // 32)
    return out


def keras_optimizers_on_both_routes(steps: int = 5, per_replica: int = 8) -> dict:
    """(torch backend) ``Adam(weight_decay=1e-4)`` and ``RMSprop(epsilon=1e-7)`` launched on 2 ranks
    through distlab's torch runtime and natively, against Keras's own ``fit`` on the global batch
    (one process, the same rows in the same order). The MLP's output layer starts 1e-4 times
    smaller and the targets are of size 1e-4, so the gradients are about 1e-4 (the largest is
    reported), where epsilon's place shows, and no residual is a difference of two large numbers.
    Also how far torch's own RMSprop (epsilon outside the square root) ends from fit: what a
    route that kept it would give."""
    import keras
    import numpy as np
    import torch

    from distlab.keras_model import wrap

    def small_mlp():
        model = mlp(seed=2)
        kernel, bias = model.layers[-1].get_weights()
        model.layers[-1].set_weights([kernel * 1e-4, bias * 0])
        return model

    rng = np.random.default_rng(0)
    g = 2 * per_replica
    x = rng.normal(size=(steps * g, 12)).astype("float32")
    y = (1e-4 * rng.normal(size=(len(x), 5))).astype("float32")
    makers = {
        "Adam(weight_decay=1e-4)": lambda: keras.optimizers.Adam(learning_rate=0.01, weight_decay=1e-4),
        "RMSprop(epsilon=1e-7)": lambda: keras.optimizers.RMSprop(learning_rate=0.01, epsilon=1e-7),
    }
    start = small_mlp().get_weights()
    out: dict = {}
    lab = _lab(2)
    try:
        for name, make in makers.items():
            ref = small_mlp()
            ref.compile(optimizer=make(), loss="mse")
            ref.fit(x, y, batch_size=g, epochs=1, shuffle=False, verbose=0)
            moved = max(float(np.abs(a - b).max()) for a, b in zip(ref.get_weights(), start))
            out[name] = {"moved": moved}
            for route in ("torch", "tensorflow"):
                run = lab.launch(
                    small_mlp(),
                    steps=steps,
                    data=(x, y),
                    loss="mse",
                    optimizer=make(),
                    batch_size=per_replica,
                    shuffle=False,
                    backend=route,
                    block=True,
                )
                weights = run.model.get_weights() if run.status == "finished" else None
                out[name][route] = {
                    "status": run.status,
                    "error": str(run.error or ""),
                    "optimizer_info": run.optimizer_info,
                    "max_weight_difference": max(
                        float(np.abs(a - b).max()) for a, b in zip(weights, ref.get_weights())
                    )
                    if weights is not None
                    else None,
                }
    finally:
        _done(lab)
    # the first step's gradients, and torch's own RMSprop on the same steps (epsilon outside the
    # square root)
    model = wrap(small_mlp())
    opt = torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9, eps=1e-7)
    for step in range(steps):
        opt.zero_grad()
        xb, yb = torch.as_tensor(x[step * g : (step + 1) * g]), torch.as_tensor(y[step * g : (step + 1) * g])
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        if step == 0:
            out["largest_first_gradient"] = max(float(p.grad.abs().max()) for p in model.parameters())
        opt.step()
    ref = small_mlp()
    ref.compile(optimizer=makers["RMSprop(epsilon=1e-7)"](), loss="mse")
    ref.fit(x, y, batch_size=g, epochs=1, shuffle=False, verbose=0)
    out["torch_rmsprop_difference"] = max(
        float(np.abs(a - b).max()) for a, b in zip(model.keras_model.get_weights(), ref.get_weights())
    )
    return out
