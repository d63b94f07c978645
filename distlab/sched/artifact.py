"""The Pollux OSDI'21 artifact's workloads replayed through distlab's simulator (its ``applications.py``).

Each job is one of six applications whose measured traces (datasets/pollux-osdi21/traces) give its
true step time for any placement and batch, its gradient statistics per epoch, and how many epochs
it needs; the job refits Pollux's step model to what it has run (artifact_goodput) and shows the
policy that speedup function, as the artifact's ``Job`` does. ``replay(6, "goodput")`` runs one
artifact workload; ``reference()`` holds the artifact's published average completion times.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distlab.errors import SchedulerError
from distlab.sched.artifact_goodput import GoodputFunction, SpeedupFunction, fit_perf_params
from distlab.sched.policy import JobSpec, Policy
from distlab.sched.simulate import SimCluster, SimResult, simulate

DATA = Path(__file__).resolve().parents[2] / "datasets" / "pollux-osdi21"
# the artifact's per-application settings (applications.py's APPLICATIONS)
SETTINGS = {
    "bert": {"max_epochs": 2},
    "cifar10": {"max_epochs": 100},
    "ncf": {"max_epochs": 10},
    "imagenet": {"max_epochs": 90},
    "deepspeech2": {"max_epochs": 80},
    "yolov3": {"max_epochs": 50, "max_local_bsz": 8},
}


class Application:
    """One application's traces: throughput by placement and batch, gradient statistics by epoch."""

    def __init__(self, name: str, root: Path = DATA) -> None:
        import pandas as pd

        trace = root / "traces" / name
        if not trace.is_dir():
            raise SchedulerError(
                f"no traces for application {name!r} under {root}; use one of {sorted(SETTINGS)}"
            )
        self.name = name
        found = {int(p.stem.split("-")[-1]): pd.read_csv(p) for p in trace.glob("validation-*.csv")}
        self.validation = dict(sorted(found.items()))
        self.placements = pd.read_csv(trace / "placements.csv")
        self.placements["num_nodes"] = self.placements.placement.map(lambda p: len(str(p)))
        self.placements["num_replicas"] = self.placements.placement.map(lambda p: sum(map(int, str(p))))
        self.scalability = pd.read_csv(trace / "scalability.csv")
        settings = SETTINGS[name]
        self.init_batch_size = min(self.validation)
        self.max_batch_size = max(self.validation)
        self.min_local_bsz = int(self.placements.local_bsz.min())
        self.max_local_bsz = int(settings.get("max_local_bsz", self.placements.local_bsz.max()))
        self.max_epochs = settings["max_epochs"]
        self._interp: Any = None
        self._by_placement: dict[int, Any] = {}

    def _bounds(self, batch_size: float) -> tuple[int, int]:
        lower = max(b for b in self.validation if b <= batch_size)
        upper = min(b for b in self.validation if b >= batch_size)
        return lower, upper

    @functools.cache  # noqa: B019 -- one Application per name lives for the process
    def progress(self, epoch: int) -> float:
        """Progress (in samples at the initial batch) needed to finish ``epoch`` epochs."""
        if epoch == 0:
            return 0.0
        return float(min(df.progress[epoch - 1] for df in self.validation.values()))

    def completion_epoch(self, batch_size: float) -> int:
        return self.max_epochs - 1  # the artifact has no target metric: every job runs max_epochs

    @functools.cache  # noqa: B019
    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """Gradient (sqr, var) at this batch during ``epoch``, interpolated between measured batches."""
        lo, hi = self._bounds(batch_size)
        a, b = self.validation[lo], self.validation[hi]
        if lo == hi:
            return float(a.grad_sqr[epoch]), float(a.grad_var[epoch])
        w = (batch_size - lo) / (hi - lo)
        return (
            float((1 - w) * a.grad_sqr[epoch] + w * b.grad_sqr[epoch]),
            float((1 - w) * a.grad_var[epoch] + w * b.grad_var[epoch]),
        )

    @functools.cache  # noqa: B019
    def throughput(self, placement: tuple[int, ...], local_bsz: int) -> tuple[float, float]:
        """(step time, sync time) of one step on ``placement`` at ``local_bsz``: measured where the
        trace has the placement, else interpolated over (nodes, replicas, local batch)."""
        from scipy.interpolate import LinearNDInterpolator, interp1d

        placement = tuple(p for p in placement if p)
        placement = min(placement[i:] + placement[:i] for i in range(len(placement)))
        key = int("".join(map(str, placement)))
        ys = ["step_time", "sync_time"]
        if key in self._by_placement or key in set(self.placements.placement.values):
            if key not in self._by_placement:
                df = self.placements[self.placements.placement == key]
                self._by_placement[key] = interp1d(df.local_bsz.values, df[ys].values, axis=0)
            out = self._by_placement[key](local_bsz)
        else:
            if self._interp is None:
                import pandas as pd

                xs = ["num_nodes", "num_replicas", "local_bsz"]
                df = self.placements.groupby(xs)[xs + ys].mean()
                df = pd.concat([df, self.scalability], ignore_index=True)
                self._interp = LinearNDInterpolator(df[xs].values, df[ys].values)
            out = self._interp([min(len(placement), 16), sum(placement), local_bsz])[0]
        step, sync = float(out[0]), float(out[1])
        if not (math.isfinite(step) and math.isfinite(sync)):
            raise SchedulerError(f"{self.name}: no throughput for placement {placement} at batch {local_bsz}")
        return step, sync


@functools.cache
def application(name: str) -> Application:
    return Application(name)


@dataclass
class ArtifactJob:
    """One artifact job (``simulator.py``'s ``Job``): true progress from traces, its speedup from its fit.

    ``fixed_replicas``/``fixed_batch`` make it a job that asks for a set size and batch (the
    baselines' "TunedJobs"), whose speedup the policy does not see.
    """

    name: str
    arrival: float
    app: Application
    fixed_replicas: int | None = None
    fixed_batch: int | None = None
    completion: float | None = None
    restarts: int | None = None
    attained: float = 0.0
    progress: float = 0.0
    epoch: int = 0
    placement: tuple[int, ...] = ()
    atomic_bsz: int = 0
    accum_steps: int = 0
    perf_params: Any = None
    grad_params: Any = None
    profile: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    rescale: float = 0.0

    def spec(self, now: float) -> JobSpec:
        app = self.app
        if self.fixed_replicas is not None:
            return JobSpec(self.name, None, 0, self.fixed_replicas, self.arrival, now - self.arrival,
                           self.restarts or 0, self.attained)  # fmt: skip
        profiled = max((k[1] for k in self.profile), default=0)
        cap = min(max(2 * profiled, 1), 64, app.max_batch_size // app.min_local_bsz)
        if app.name == "ncf":
            cap = 1
        return JobSpec(self.name, self.speedup_fn(), 0, cap, self.arrival, now - self.arrival,
                       self.restarts or 0, self.attained)  # fmt: skip

    def goodput_fn(self) -> GoodputFunction:
        """The goodput model the job's speedup and batch choice read (Pollux's, fitted to its steps)."""
        return GoodputFunction(self.perf_params, self.grad_params, self.app.init_batch_size)

    def speedup_fn(self) -> SpeedupFunction | None:
        if self.perf_params is None:
            return None  # nothing measured yet: speedup = replicas
        app = self.app
        fn = self.goodput_fn()
        return SpeedupFunction(fn, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz), True)

    def _set_local_bsz(self) -> None:
        app = self.app
        nodes, replicas = len(self.placement), sum(self.placement)
        batch = self.fixed_batch
        if batch is None and self.perf_params is None:
            batch = max(app.init_batch_size, app.min_local_bsz * replicas)
        if batch is None:
            fn = self.goodput_fn()
            _, self.atomic_bsz, self.accum_steps = fn.optimize(
                nodes, replicas, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz), True
            )
        else:
            local = math.ceil(batch / replicas - 1e-8)
            self.accum_steps = math.ceil(local / app.max_local_bsz - 1e-8) - 1
            if replicas == 1 and batch > app.init_batch_size:
                self.accum_steps = max(1, self.accum_steps)
            self.atomic_bsz = math.ceil(local / (self.accum_steps + 1) - 1e-8)
        self.atomic_bsz = min(self.atomic_bsz, int(app.max_batch_size / (replicas * (self.accum_steps + 1))))

    def _observe(self, nodes: int, replicas: int, step: float, sync: float, sqr: float, var: float) -> None:
        self.grad_params = (sqr, var)
        key = (nodes, replicas, self.atomic_bsz)
        if key in self.profile:
            return
        if self.fixed_replicas is not None:
            self.profile[key] = (step, sync)
            return  # a fixed job's batch and size never read the fit: skip it
        self.profile[key] = (step, sync)
        cols = np.array([[*k, *v] for k, v in self.profile.items()], dtype=float)
        self.perf_params = fit_perf_params(
            cols[:, 0], cols[:, 1], cols[:, 2], cols[:, 3] - cols[:, 4], cols[:, 3]
        )

    def reallocate(self, placement: tuple[int, ...]) -> None:
        self.placement = tuple(p for p in placement if p)
        if self.placement:
            self._set_local_bsz()
            self.rescale = 30.0  # the artifact charges a fixed 30 s per restart
            self.restarts = 0 if self.restarts is None else self.restarts + 1
        else:
            self.atomic_bsz = 0

    def step(self, now: float, seconds: float) -> None:
        if not self.placement or self.completion is not None:
            return
        app, replicas = self.app, sum(self.placement)
        delay = min(self.rescale, seconds)
        self.rescale -= delay
        self.attained += delay * replicas
        t, seconds = now + delay, seconds - delay
        while seconds > 0 and self.completion is None:
            batch = replicas * self.atomic_bsz * (self.accum_steps + 1)
            step, sync = app.throughput(self.placement, self.atomic_bsz)
            sqr, var = app.grad_stats(batch, self.epoch)
            scale = batch / app.init_batch_size
            gain = (var + sqr) / (var / scale + sqr)
            self._observe(len(self.placement), replicas, step, sync, sqr, var)
            goodput = gain / (step + (step - sync) * self.accum_steps)
            target = app.progress(self.epoch + 1)
            if self.progress + goodput * seconds < target:
                self.progress += goodput * seconds
                self.attained += seconds * replicas
                seconds = 0
            else:
                self.epoch += 1
                delta = round(float((target - self.progress) / goodput))
                if self.epoch > app.completion_epoch(batch):
                    self.completion = t + delta
                self.progress = target
                t += delta
                self.attained += delta * replicas
                seconds -= delta
            self._set_local_bsz()  # the batch is re-chosen between epochs


def load_workload(
    number: int,
    *,
    fixed: bool = False,
    load: str = "",
    root: Path = DATA,
    job: type[ArtifactJob] | None = None,
) -> list[ArtifactJob]:
    """Workload ``number`` (1-8) of the artifact; ``fixed``: jobs keep the workload's replicas and batch;
    ``job``: the job class (ArtifactJob, or a subclass with another goodput model)."""
    import pandas as pd

    path = root / f"workloads{'-' + load if load else ''}" / f"workload-{number}.csv"
    if not path.exists():
        raise SchedulerError(f"no artifact workload {path}; number is 1-8")
    jobs = []
    for row in pd.read_csv(path).to_dict("records"):
        one = (job or ArtifactJob)(str(row["name"]), float(row["time"]), application(str(row["application"])))
        if fixed:
            one.fixed_replicas, one.fixed_batch = int(row["num_replicas"]), int(row["batch_size"])
        elif row["application"] == "ncf":
            one.fixed_batch = 32768  # as the artifact's Pollux run
        jobs.append(one)
    return jobs


def replay(
    number: int,
    policy: Policy | str,
    *,
    fixed: bool | None = None,
    interval: float = 60.0,
    job: type[ArtifactJob] | None = None,
) -> SimResult:
    """One artifact workload on its cluster (16 hosts x 4 GPUs) under ``policy``.

    FIFO jobs ask for the workload's replicas and batch (as the artifact's Tiresias baseline), the
    goodput policy's jobs adapt their own (as its Pollux run), unless ``fixed`` says otherwise.
    ``job``: the job class, e.g. ``artifact_distlab.DistlabJob`` (distlab's step model).
    """
    fixed = (policy == "fifo") if fixed is None else fixed
    jobs = load_workload(number, fixed=fixed, job=job)
    return simulate(jobs, policy, SimCluster(16, 4), interval=interval)


def reference(root: Path = DATA) -> dict[str, Any]:
    """The artifact's published average JCTs (results-jobload, 1.0x load), per policy and workload."""
    return json.loads((root / "results-jobload-1.0.json").read_text())
