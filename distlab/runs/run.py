"""Run: the handle of a launched job, driven by a client-side thread that restarts it elastically.

Long because a Run is one handle guarded by one lock: its driver thread, elastic restarts, cancel and the
views over its records share that state; its row and card are in report.py, its figures in notebook/."""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distlab.cluster import spmd
from distlab.cluster.cluster import current_client
from distlab.errors import DistlabError, DistlabWarning, LaunchError
from distlab.runs import ckpt_dirs
from distlab.runs import metrics as _metrics
from distlab.runs.forecast import Forecast, NoForecast
from distlab.runs.progress import StepBar
from distlab.runs.report import model_name, run_card, run_row
from distlab.runs.resize import CANCEL_WITHIN, Resizable

if TYPE_CHECKING:
    from distlab.runs.route import Route
    from distlab.runtime.job import RankJob

LOST_WORKER_GRACE = 2.0  # seconds the scheduler may take to notice a dead worker after a rank saw it


class PredictionDriftWarning(DistlabWarning):
    """Runs keep landing far from their predictions: the Lab refitted its cost model to them."""


@dataclasses.dataclass(frozen=True)
class RunHooks:
    """What a Run gets from the Lab that launches it (it knows no Lab): the Dask ``client`` its
    ranks and records go through, ``on_finish(run)`` called once it finished (the Lab refits its
    cost model and returns a note for the user, or None), ``calibrate_call`` (how the user
    calibrates: the card names it) and ``new_id()`` (the next run id, unique in the process)."""

    client: Any
    new_id: Callable[[], str]
    on_finish: Callable[[Run], str | None] | None = None
    calibrate_call: str = "lab.calibrate()"


class Run(Resizable):
    """A launched training job: status, live records, measured throughput, the trained model.

    Status goes ``pending -> running -> finished | failed | cancelled`` (on a shared Lab it may
    start ``queued`` and pass through ``paused`` while it is resized). Records arrive live
    through Dask worker events; ``on_record`` callbacks (e.g. the picker's step line) are
    called with each record, from the client's event thread.
    """

    def __init__(
        self,
        hooks: RunHooks,
        run_id: str,
        model: Any,
        strategy: Any,
        job: Any,
        workers: list[str],
        threads: list[int],
        *,
        elastic: bool,
        replan: Callable[[list[str]], Any],
        forecast: Forecast | None = None,
        data_info: str = "",
        loss_info: str = "",
        route: Route,
        payload: Any = None,
    ) -> None:
        self.id = run_id
        self.route = route  # how its ranks run, its trained model loads, its prediction is made
        self.backend = route.name  # "torch" or "tensorflow"
        self.payload = payload  # what the route's ranks read besides the job (a native run's files)
        self.data_info = data_info  # what it trains on, in one line (name, size, shapes)
        self.loss_info = loss_info  # what it minimises
        self.optimizer_info = ""  # what steps it, and where that came from (distlab.conventions)
        self.var_name = "run"  # the notebook variable the card names (%distlab launch -o NAME)
        self.calibrate_call = hooks.calibrate_call  # what calibrates its Lab, as the user types it
        self.drift_note: str | None = None  # what on_finish said after it finished (a drift, once)
        self._client, self._on_finish = hooks.client, hooks.on_finish
        self.strategy = strategy
        self.steps: int | None = job.steps or None  # None: a user's loop (Lab.run), done when it returns
        self.result: Any = None  # rank 0's return value of a user's loop (Lab.run)
        self.batch_size = job.batch_size or strategy.batch.per_replica
        self.elastic = elastic
        # what the Lab predicted, or why it did not (its route says: no cost model, a slowed run...)
        self.forecast = (
            forecast if forecast is not None else NoForecast(run_id, lambda: route.no_prediction(self))
        )
        self.predicted_throughput = forecast.prediction.throughput if forecast is not None else math.nan
        self.refitted_throughput = math.nan  # the Lab's prediction for this run refitted on every run so far
        self.on_record: list[Callable[[dict[str, Any]], None]] = []
        self.on_done: list[Callable[[Run], None]] = []  # called once it ended (a shared Lab's scheduler)
        self.error: DistlabError | None = None
        self.traceback = ""
        self.last_checkpoint: dict[str, Any] | None = None  # {"step", "at", "path"} once the run ended
        self.view: Any = None  # the notebook's LiveView of this run, once shown
        self.details: dict[str, Any] = {}  # a native run: its variables' placement, rank 0's "child"
        # a gossip run's mean over ranks of ||x_r - mean x||^2 at its end (None for other kernels)
        self.consensus_distance: float | None = None
        self.launched_at = time.perf_counter()
        self.first_record_at: float | None = None
        self._model0, self._job, self._workers, self._threads, self._replan = (
            model,
            job,
            workers,
            threads,
            replan,
        )
        self._status = "pending"
        self._throughput: float | None = None
        self._last: dict[tuple[int, int], int] = {}  # (restart, rank): its latest step (in order)
        self._frame = _metrics.FrameCache()  # run.metrics: each record a row once, not kept as a dict
        self._steps_done = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._cancel = False
        # a resize (lab.scale): the ranks stop at a step, write a checkpoint there, and the run
        # waits for its new workers (set by resume_on) before it resumes on them
        self._pausing = False
        self._paused = threading.Event()
        self._resume_with: list[str] | None = None
        self._resume = threading.Event()
        self._group: spmd.RankGroup | None = None
        self._state_dict: Any = None
        self._model: Any = None
        self._topic = f"distlab-run-{run_id}"
        self._trace: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
        self._whatif: tuple[Any, Any] | None = None  # (what it was built from, whatif.Trace)
        self._thread = threading.Thread(target=self._drive, name=f"distlab-run-{run_id}", daemon=True)

    def start(self) -> None:
        """Start driving the run (its ranks start on their workers); ``Lab.launch`` calls it."""
        self._client.subscribe_topic(self._topic, self._on_event)
        self._thread.start()

    # -- live records --------------------------------------------------------------------------
    def _on_event(self, event: Any) -> None:
        _, msg = event
        for rec in msg.get("records", ()):
            self._add(rec)

    def _add(self, rec: dict[str, Any]) -> None:
        key = (int(rec.get("restart", 0)), int(rec["rank"]), int(rec["step"]))
        spans = rec.get("trace")
        if spans is not None:  # a traced step: its spans kept beside the metrics (runtime/trace.py)
            rec = {k: v for k, v in rec.items() if k != "trace"}
        with self._lock:
            new = key[2] > self._last.get(key[:2], -1)  # else sent again: the later record is kept
            self._last[key[:2]] = max(key[2], self._last.get(key[:2], -1))
            self._frame.add(rec, new)
            # the slowest rank's: an asynchronous run is done when its slowest rank is
            if len(mine := [st for (r, _), st in self._last.items() if r == key[0]]) >= self.world:
                self._steps_done = max(self._steps_done, min(mine) + 1)
            if spans is not None:
                self._trace[key] = [{**e, "restart": key[0], "rank": key[1], "step": key[2]} for e in spans]
            if self.first_record_at is None:
                self.first_record_at = time.perf_counter()
        if new:
            for cb in list(self.on_record):
                try:
                    cb(rec)
                except Exception:  # noqa: BLE001 - a broken chart must not break the run
                    pass

    # -- the driver ------------------------------------------------------------------------------
    def _drive(self) -> None:
        with current_client(self._client):  # not the newest Lab's: cluster.current_client says why
            self._drive_segments()

    def _drive_segments(self) -> None:
        client = self._client
        workers, threads, job = list(self._workers), list(self._threads), self._job
        restart = 0
        try:
            while True:
                if self._cancel:
                    self._status = "cancelled"
                    return
                self._group = None
                try:
                    fn, args = self._rank_call(job, restart, threads)
                    self._group = spmd.start_ranks(
                        client,
                        workers,
                        fn,
                        args,
                        run_id=self.id,
                        threads=threads,
                        timeout=job.timeout,
                    )
                    self._status = "running"
                    if self._cancel:  # cancel() ran while the ranks were being started
                        self._group.stop(abort_after=spmd.CANCEL_ABORT_AFTER)
                    results = self._group.wait(None)
                    if self._pausing and not self._cancel and not self._complete(results):
                        self._group.close()
                        new = self._wait_for_workers()
                        if new is None:  # cancelled while paused
                            self._status = "cancelled"
                            return
                        restart += 1
                        workers = self._workers = new
                        job, threads = self._resume_job(job, workers, restart)
                        continue
                except (spmd.RankFailure, spmd.WorkerLost, LaunchError) as exc:
                    if self._group is not None:
                        self._group.close()
                    if self._cancel:
                        self._status = "cancelled"
                        return
                    lost = self._lost(workers, exc)
                    if not lost or not self.elastic:
                        self._fail(exc, lost)
                        return
                    alive = spmd.workers_info(client)  # survivors: neither lost nor restarted
                    workers = [w for w in workers if w not in lost and w in alive]
                    if not workers:
                        self._fail(exc, lost)
                        return
                    restart += 1
                    self._workers = workers
                    job, threads = self._resume_job(job, workers, restart)
                    continue
                self._group.close()
                self._finish(results)
                if self._cancel:
                    self._status = "cancelled"
                return
        except BaseException as exc:  # noqa: BLE001 - the driver must always settle the run
            if self._group is not None:
                try:
                    self._group.close()
                except Exception:  # noqa: BLE001 - e.g. the Lab closed its client under a cancelled run
                    pass
            if self._cancel:
                self._status = "cancelled"
            else:
                self._fail(exc, [])
        finally:
            try:
                client.unsubscribe_topic(self._topic)
            except Exception:  # noqa: BLE001
                pass
            self.last_checkpoint = ckpt_dirs.last(self._job.checkpoint_dir)
            ckpt_dirs.remove_run(self._job.checkpoint_dir)  # nothing resumes an ended run
            self._done.set()
            self._tell_done()

    def _tell_done(self) -> None:
        for cb in list(self.on_done):
            try:
                cb(self)
            except Exception:  # noqa: BLE001 - a scheduler's bookkeeping must not break the run
                pass

    def _rank_call(self, job: RankJob, restart: int, threads: list[int]) -> tuple[Any, tuple[Any, ...]]:
        """The function each rank's task runs and its arguments: its route's (runs/route.py)."""
        return self.route.rank_call(self, job, restart, threads)

    @property
    def checkpoint(self) -> str | None:
        """The run's newest checkpoint file while it can resume from it (None once it ended:
        ``last_checkpoint`` says when it was taken; ``run.model`` has the trained weights)."""
        info = None if self._done.is_set() else ckpt_dirs.last(self._job.checkpoint_dir)
        return info["path"] if info else None

    @property
    def topic(self) -> str:
        """The Dask event topic its ranks send their step records on."""
        return self._topic

    def _complete(self, results: list[dict[str, Any]]) -> bool:
        """Every step ran (a stop asked for near the end may come too late to matter)."""
        return not any(r.get("stopped") for r in results)

    def _lost(self, workers: list[str], exc: BaseException) -> list[str]:
        """Workers that left the cluster by themselves (not the ones restarted to stop a stuck rank)."""
        if isinstance(exc, spmd.WorkerLost):
            return [w for w in exc.workers if self._group is None or w not in self._group.restarted]
        restarted = self._group.restarted if self._group is not None else set()
        own = getattr(exc, "own_error", False)  # a rank's own raise: its worker is there, no wait
        deadline = time.monotonic() + (LOST_WORKER_GRACE if self.elastic and not own else 0.0)
        while True:
            alive = set(spmd.workers_info(self._client))
            lost = [w for w in workers if w not in alive and w not in restarted]
            if lost or time.monotonic() > deadline:
                return lost
            time.sleep(0.1)

    def _resume_job(self, job: Any, workers: list[str], restart: int) -> tuple[Any, list[int]]:
        """Re-plan for the surviving workers and resume from the last checkpoint (data position in
        samples)."""
        from distlab.runtime import checkpoint

        path = checkpoint.latest(job.checkpoint_dir) if job.checkpoint_dir else None
        start_step, offset = 0, 0
        if path is not None:
            state = checkpoint.load(path)
            start_step = int(state.get("step", 0))
            offset = int(state.get("samples", start_step * (job.batch_size or self.batch_size) * job.world))
        strategy, threads, options = self._replan(workers)
        self.strategy = strategy
        new = dataclasses.replace(
            job,
            world=len(workers),
            strategy=strategy,
            options=dataclasses.replace(job.options, **options),
            start_step=start_step,
            sample_offset=offset,
            resume_from=str(path) if path is not None else None,
        )
        return new, threads

    def _fail(self, exc: BaseException, lost: list[str]) -> None:
        if isinstance(exc, spmd.RankFailure):
            self.traceback = exc.tb
            what = exc.summary()
        else:
            what = f"{type(exc).__name__}: {exc}" if not isinstance(exc, DistlabError) else str(exc)
        if lost and not self.elastic:
            what = (
                f"worker(s) {', '.join(lost)} left the cluster ({what}); "
                "launch with elastic=True to resume from checkpoints"
            )
        self.error = LaunchError(f"run {self.id} failed: {what}")
        self._status = "failed"

    def _finish(self, results: list[dict[str, Any]]) -> None:
        for out in results:
            for rec in out.get("records") or []:
                self._add(rec)
        r0 = results[0]
        self.details = dict(r0.get("details") or {})
        self.consensus_distance = r0.get("consensus_distance")
        self._state_dict, self.result = r0.get("state_dict"), r0.get("result")
        self._status = "finished"
        try:
            if self._on_finish is not None:
                self.drift_note = self._on_finish(self)
        except Exception:  # noqa: BLE001 - a refit is a bonus, never a reason to fail a finished run
            pass

    # -- public ----------------------------------------------------------------------------------
    @property
    def status(self) -> str:
        return self._status

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the run to end, without raising its error; whether it did."""
        return self._done.wait(timeout)

    @property
    def workers(self) -> list[str]:
        """The worker addresses its ranks run on, rank order (the survivors after a restart; none
        while it is queued)."""
        return [] if self._status == "queued" else list(self._workers)

    @property
    def traced(self) -> bool:
        """Launched with ``trace=True``: every rank records its timeline."""
        return self._job.options.trace

    @property
    def slowdown(self) -> dict[int, float]:
        """The stragglers asked for (``lab.launch(slowdown=...)``): rank -> compute factor."""
        return dict(self._job.options.slowdown)

    @property
    def jitter(self) -> float:
        """The step-to-step variation asked for (``lab.launch(jitter=...)``; RunOptions.jitter)."""
        return self._job.options.jitter

    def wait(self, timeout: float | None = None, progress: bool = True) -> Run:
        """Block until the run ends; raise its error if it failed. Ctrl-C cancels it on the workers.
        ``progress``: a progress bar after a second (not when the run's live view is showing)."""
        bar = StepBar(f"run {self.id}", self.steps, show=progress and self.view is None)
        start = time.monotonic()
        try:
            while not self._done.wait(0.1):
                if timeout is not None and time.monotonic() - start > timeout:
                    raise LaunchError(
                        f"run {self.id}: still {self.status} after {timeout:g} s; wait longer or run.cancel()"
                    )
                bar.advance(self.steps_done)
        except KeyboardInterrupt:
            self.cancel()
            raise KeyboardInterrupt(f"run {self.id} interrupted: cancelled on every worker") from None
        finally:
            bar.close(self.steps_done)
        if self.view is not None:  # its final drawing goes out with the cell that waits (papermill keeps it)
            self.view.finish()
        if self._status == "failed" and self.error is not None:
            raise self.error
        note, self.drift_note = self.drift_note, None
        if note:
            import warnings

            warnings.warn(note, PredictionDriftWarning, stacklevel=2)
        return self

    @property
    def steps_done(self) -> int:
        """Steps every rank has recorded so far (the slowest one's last step number plus one)."""
        return self._steps_done

    def cancel(self, timeout: float = CANCEL_WITHIN) -> Run:
        """Stop every rank (within ``timeout`` seconds); the Lab is usable again afterwards."""
        if self._done.is_set():
            return self
        with self._lock:
            self._cancel = True
            queued = self._status == "queued"
        if queued:  # never started: removed from its Lab's queue, nothing ran
            self._status = "cancelled"
            self._done.set()
            self._tell_done()
            return self
        group = self._group
        if group is not None:  # ranks that have not stopped at a step within a second are aborted
            group.stop(abort_after=spmd.CANCEL_ABORT_AFTER)
        self._done.wait(timeout)
        if not self._done.is_set():
            raise LaunchError(
                f"run {self.id}: ranks did not stop within {timeout:g} s; lab.close() ends the workers"
            )
        return self

    @property
    def metrics(self) -> Any:
        """DataFrame: run_id, step, rank, loss, samples, step_time, comm_time, wall_time, restart, world."""
        with self._lock:
            return self._frame.frame()

    @property
    def trace_events(self) -> list[dict[str, Any]]:
        """A traced run's spans so far (``trace=True``): name, cat, track, start and end (seconds
        on rank 0's clock), rank, step, restart and args (bytes, peers); also of a failed run."""
        with self._lock:
            return [e for key in sorted(self._trace) for e in self._trace[key]]

    def timeline(self, steps: int = 3, predicted: bool = True) -> Any:
        """Plotly: each rank's compute and communication over the last ``steps`` steps, the cost
        model's predicted step below (notebook/timeline.py)."""
        from distlab.notebook.timeline import timeline_figure

        return timeline_figure(self, steps, predicted and bool(self.forecast))

    def whatif(self, cost_model: Any = None, **changes: Any) -> Any:
        """This traced run replayed with one thing changed (``bandwidth``, ``latency``, ``world``,
        ``hosts``, ``bucket_mb``, ``overlap``, ``compute_scale``, ``strategy``; none: the identity
        replay), beside the cost model's prediction of the same: a ``distlab.whatif.WhatIf``."""
        from distlab.whatif import of_run

        key = id(cost_model)
        if self._whatif is None or self._whatif[0] != (key, self.steps_done):
            self._whatif = ((key, self.steps_done), of_run(self, cost_model))
        return self._whatif[1].whatif(**changes)

    def save_trace(self, path: Any) -> Any:
        """Write the trace as Chrome trace-event JSON (open it in https://ui.perfetto.dev); returns the
        path."""
        import json
        from pathlib import Path

        from distlab.notebook.timeline import chrome_trace

        path = Path(path)  # notebook/timeline.save_trace, with no predicted step where none was made
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(chrome_trace(self, predicted=bool(self.forecast))))
        return path

    @property
    def restarts(self) -> int:
        with self._lock:
            return max((k[0] for k in self._last), default=0)

    @property
    def throughput(self) -> float:
        """Steady-state samples/s, warm-up excluded (see ``distlab.runs.metrics.throughput``)."""
        if self._throughput is not None:
            return self._throughput
        tp = _metrics.throughput(self.metrics)
        if self.done:  # its records are final: lab.runs reads it once per run, not once per refit
            self._throughput = tp
        return tp

    @property
    def model(self) -> Any:
        """The trained model: rank 0's weights loaded into a copy of the launched model."""
        if self._model is None:
            if self._state_dict is None:
                raise LaunchError(f"run {self.id}: no trained model ({self.status}); wait() for it to finish")
            self._model = self.route.trained_model(self._model0, self._state_dict)
        return self._model

    @property
    def model_name(self) -> str:
        """The launched model's class name (``lab.runs``' and ``lab.queue``'s model column)."""
        return model_name(self._model0)

    @property
    def world(self) -> int:
        return self.strategy.world if self.strategy is not None else len(self._workers)

    def row(self) -> dict[str, Any]:
        """This run's row of ``lab.runs`` (runs/report.py: the columns and what they mean)."""
        return run_row(self, self.model_name)

    @property
    def step_metrics(self) -> tuple[Any, ...]:
        """The metrics each step reports beside the loss (a compiled Keras model's; columns of
        ``run.metrics``; distlab.step_metrics)."""
        return tuple(self._job.options.metrics)

    @property
    def metric_names(self) -> list[str]:
        return [m.name for m in self.step_metrics]

    @property
    def step_table(self) -> dict[tuple[int, int], float] | None:
        """An adaptive run's predicted seconds per step of each (per-replica batch, accumulation)
        its controller may choose, for the current world (None for a fixed batch)."""
        table = (self._job.options.adaptive or {}).get("table")
        return {(int(b), int(k)): float(s) for b, k, s in table} if table else None

    def plot(self) -> Any:
        """The run so far as a plotly figure: loss, throughput against the prediction, each rank's
        step time, and an adaptive run's batch, noise scale and goodput (``notebook/live.py``)."""
        from distlab.notebook.live import run_figure

        return run_figure(self)

    def live(self, interval: float = 0.5) -> Any:
        """Show the run's card and figure in the notebook until it ends, the card redrawn every
        ``interval`` seconds and the figure every five (the saved notebook keeps the last
        drawing); returns the ``LiveView``."""
        from distlab.notebook.live import LiveView

        self.view = LiveView(self, interval)
        return self.view

    def _ipython_display_(self) -> None:
        """In a notebook a run shows as its live view; elsewhere (a terminal) as its one-line repr."""
        from IPython import get_ipython

        if getattr(get_ipython(), "kernel", None) is None:
            print(repr(self))
            return
        self.live()

    def __repr__(self) -> str:
        progress = f"{self.steps_done}{f'/{self.steps}' if self.steps else ''} steps"
        return f"<Run {self.id} {self.status}: {self.strategy.name} on {self.world} ranks, {progress}>"

    @property
    def losses(self) -> Any:
        """The training loss per step (a pandas Series indexed by step; each the mean over ranks of
        that step's loss), as ``fit``'s history has it; empty before the first step."""
        import pandas as pd

        m = self.metrics
        if len(m) == 0 or "loss" not in m:
            return pd.Series(dtype="float64", name="loss")
        return m.groupby("step")["loss"].mean().dropna().rename("loss")

    def _repr_html_(self) -> str:
        return run_card(self)
