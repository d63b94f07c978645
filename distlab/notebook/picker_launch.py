"""The picker's Launch button: run the selected strategy on the Lab in the background, show its
steps, and plot the measured throughput against the Lab's prediction (a mixin of StrategyPicker)."""

from __future__ import annotations

import html
import math
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distlab.errors import LaunchError
from distlab.notebook.picker_charts import draw_measured
from distlab.notebook.ranking import short_label

if TYPE_CHECKING:
    from distlab.lab import Lab

PROGRESS_EVERY = 0.25  # seconds between step-progress updates: records arrive once per rank per step
SAME = 1e-3  # two predictions this close (relative) read as the same number


class PickerLaunch:
    """Launching from the picker; the attributes it uses are StrategyPicker's."""

    lab: Lab | None  # None: a picker over a ResourceSpec, which cannot launch
    model: Any
    data: Any
    loss: Any
    profile: Any
    runs: list[dict[str, Any]]

    # -- launching ----------------------------------------------------------------------------
    def _on_launch(self, _button: Any = None) -> threading.Thread | None:
        """Launch the selected strategy in a background thread (returned, and kept as ``launch_thread``)."""
        with self._reporting("launch"):
            with self._lock:
                if self._in_flight:
                    return None
                self._error_line = ""
                if self._lab_closed():
                    self._show()  # says the Lab is closed and how to start one; the button goes off
                    return None
                if self.lab is None:
                    raise LaunchError("no Lab: pass a Lab (not a ResourceSpec) to launch from the picker")
                if self.model is None:
                    raise LaunchError("no model: create the picker with model=... (or use %distlab pick VAR)")
                self._in_flight = True  # one launch at a time, from the first click
            try:
                return self._start_launch()
            except BaseException:
                self._in_flight = False
                raise
        return None

    def _start_launch(self) -> threading.Thread:
        real = self.lab.resources  # asks the scheduler: outside the lock a record callback may wait on
        with self._lock:
            k = min(self.world, real.world)
            res = real.first(k)
            strategy = self._build(self.builder.value, res, self.options())
            shown = self._cm if self._cm is not None else self.current_cost_model()
            before = float(shown.predict(self.profile, res, strategy).throughput)
            refitted = self.current_cost_model() is not shown
            where = workers_of(k) + (f" (of the cluster's {real.world})" if k < real.world else "")
            whatif = self._what_if(real, k)
            self._run_line = f"launching <b>{html.escape(strategy.name)}</b> on {where} ...{whatif}"
            args = (strategy, int(self.steps.value), where, before, refitted, whatif)
            thread = threading.Thread(
                target=self._launch_and_wait, args=args, name="distlab-picker-launch", daemon=True
            )
            self._show()
            self.launch_thread = thread
            thread.start()
        return thread

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for the latest Launch to finish (at most ``timeout`` seconds); return its Run (None when
        it never started)."""
        thread = self.launch_thread
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise LaunchError(f"picker: the launch is still running after {timeout:g} s; wait longer")
        return self.last_run

    def _what_if(self, real: Any, k: int) -> str:
        """A what-if that is not the cluster: Launch runs on the cluster, against the Lab's prediction."""
        res = self.resources()
        if res is self.base_resources or (res.num_hosts == 1 and self.world <= real.world):
            return ""  # the what-if is the cluster, or its first workers
        wanted = f"{res.num_hosts} host{'s' if res.num_hosts > 1 else ''} x {self.per_host.value} ranks" + (
            f", {self.network.value} between hosts" if res.num_hosts > 1 else ""
        )
        return (
            f"<br>the what-if ({wanted}) is not this cluster: Launch runs on the real cluster's "
            f"{workers_of(k)} and is measured against the Lab's prediction for them"
        )

    def _launch_and_wait(
        self, strategy: Any, steps: int, where: str, before: float, refitted: bool, whatif: str
    ) -> None:
        """(background thread) Launch, show steps as they arrive, wait, then plot measured vs predicted."""
        ok = False
        try:
            with self._reporting("launch"):
                cm = self.lab.cost_model
                run = self.lab.launch(
                    self.model, strategy=strategy, steps=steps, data=self.data, loss=self.loss
                )
                # lab.launch measured the model's own step first when its cost model changed (a refit
                # comes only after the run has finished)
                measured = self.lab.cost_model is not cm and run.status in ("pending", "running")
                self.last_run = run
                head = f"run {html.escape(run.id)}: <b>{html.escape(strategy.name)}</b> on {where}"
                run.on_record.append(self._progress(run, head, whatif))
                with self._lock:
                    self._run_line = f"{head}: starting{whatif}"
                    self._show()
                while not run.done:
                    time.sleep(0.1)
                with warnings.catch_warnings(record=True) as caught:  # the Lab's drift note: shown below
                    warnings.simplefilter("always")
                    run.wait(progress=False)  # done: returns at once, or raises the run's error
                notes = [html.escape(str(c.message)) for c in caught]
                self._after_run(run, head, before, _why(refitted, measured), whatif, notes)
                ok = True
        finally:
            self._in_flight = False
            if not ok:  # the error line says what happened; a "launching ..." line would be stale
                self._run_line = ""
            with self._reporting("launch"):
                self._show()

    def _progress(self, run: Any, head: str, whatif: str) -> Callable[[dict[str, Any]], None]:
        """An ``on_record`` callback showing "step k/N", at most every PROGRESS_EVERY seconds."""
        seen = {"step": 0, "at": 0.0}

        def on_record(rec: dict[str, Any]) -> None:
            with self._reporting("progress"):
                k = int(rec["step"]) + 1
                now = time.monotonic()
                if k <= seen["step"] or (k < run.steps and now - seen["at"] < PROGRESS_EVERY):
                    return
                seen["step"], seen["at"] = k, now
                # this runs on the Dask client's event thread: never hold it up behind a redraw
                if self._lock.acquire(timeout=PROGRESS_EVERY):
                    try:
                        if self._in_flight:
                            self._run_line = f"{head}: step {k}/{run.steps}{whatif}"
                            self._show()
                    finally:
                        self._lock.release()

        return on_record

    def _after_run(self, run: Any, head: str, before: float, why: str, whatif: str, notes: list[str]) -> None:
        if run.status != "finished":  # cancelled (lab.close(), run.cancel()): nothing was measured
            with self._lock:
                self._run_line = "<br>".join([f"{head}: {run.status}, {run.steps} steps asked", *notes])
                self._show()
            return
        measured, predicted = float(run.throughput), float(run.predicted_throughput)
        self.runs.append(
            {
                "run_id": run.id,
                "strategy": run.strategy.name,
                "world": run.world,
                "predicted_throughput": predicted,
                "measured_throughput": measured,
            }
        )
        with self._lock:
            draw_measured(self.measured, self.runs, [short_label(r["strategy"], 24) for r in self.runs])
            self.measured_view.show()
            line = f"{head}, {run.steps} steps: measured {measured:,.0f} samples/s"
            if math.isnan(predicted):
                line += "; the Lab made no prediction (it has no cost model: lab.calibrate())"
            else:
                line += f", predicted {predicted:,.0f} (the Lab's prediction, made before the run"
                if not whatif and abs(predicted - before) > SAME * max(abs(before), 1.0):
                    line += f"; the picker showed {before:,.0f}: {why}"
                line += ")"
            self._run_line = "<br>".join([line + whatif, *notes])
            self._refresh(rank=True)  # the Lab refitted its cost model on this run


def closed_text() -> str:
    from distlab.lab import CLOSED  # imports dask: only once a Lab is in play

    return CLOSED


def _why(refitted: bool, measured: bool) -> str:
    """Why the Lab's prediction for a run is not the one the picker showed, in one clause."""
    if refitted:
        return "lab.cost_model changed since the picker drew (a finished run refits it)"
    if measured:
        return "the Lab measured the model's own step on the workers at this batch first"
    return "the Lab predicts from its own profile of the model"


def workers_of(n: int) -> str:
    return f"{n} worker" + ("" if n == 1 else "s")
