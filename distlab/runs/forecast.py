"""What the Lab predicts for a run before it starts, and how it learns from the runs that finished:
the forecast kept with each run (or why there is none), the online refit after each (Pollux refits
online), and the note a user gets when the latest runs all landed far from their predictions."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from distlab.errors import LaunchError

DRIFT_RUNS, DRIFT_RATIO = 2, 1.3


@dataclasses.dataclass(frozen=True)
class Forecast:
    """What the Lab predicted for a run before it started: ``prediction`` as shown (refitted on the
    runs before it), ``base`` the calibration's own (what ``CostModel.refit`` fits), and the
    profile and resources to predict it again after a refit."""

    prediction: Any
    base: Any
    profile: Any
    resources: Any
    model_key: str
    optimizer: str | None = None  # what the run's optimizer costs like ("sgd", "momentum", "adam")
    cost_model: Any = None  # the model that predicted it (run.whatif prices its what-ifs with it)


class NoForecastError(LaunchError, AttributeError):
    """A forecast's figure read on a run the Lab did not predict (an AttributeError too, so
    ``getattr(run.forecast, name, default)`` and ``hasattr`` answer as for a missing attribute)."""


class NoForecast:
    """``run.forecast`` of a run the Lab did not predict: false (``if run.forecast:``), shown as the
    reason, and reading its prediction (``run.forecast.prediction``, ``.base``, ``.model_key``)
    raises the reason as one ``NoForecastError``. What a replay reads beside a forecast (the
    ``profile``, ``resources``, ``optimizer`` and ``cost_model`` it was made with) is None: unknown."""

    profile = resources = optimizer = cost_model = None

    def __init__(self, run_id: str, reason: Callable[[], str]) -> None:
        self._run_id = run_id
        self._reason = reason  # the run's route says why, once the run exists (runs/route.py)

    @property
    def reason(self) -> str:
        """Why the run has no forecast, and the call that gives the next run one."""
        return self._reason().removeprefix("none: ")

    def __bool__(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:  # only names the class does not have
        if name.startswith("_"):  # IPython's display probes (_repr_html_, ...) and copy's
            raise AttributeError(name)
        raise NoForecastError(f"run {self._run_id} has no forecast ({name}): {self.reason}")

    def __repr__(self) -> str:
        return f"<no forecast for run {self._run_id}: {self.reason}>"


def forecast_run(
    cost_model: Any, profile: Any, res: Any, st: Any, optimizer: str | None = None
) -> Forecast | None:
    """The run's prediction by ``cost_model`` (None without one) on the ranks it gets, its
    optimizer priced (``"sgd"``, ``"momentum"``, ``"adam"``)."""
    if cost_model is None:
        return None
    from distlab.costmodel.compute import model_key

    try:
        sub = res.first(st.world)
        return Forecast(
            cost_model.predict(profile, sub, st, optimizer=optimizer),
            cost_model.without_refit().predict(profile, sub, st, optimizer=optimizer),
            profile,
            sub,
            model_key(profile),
            optimizer,
            cost_model,
        )
    except Exception:  # noqa: BLE001 - a prediction is a bonus column, never a reason not to run
        return None


def refit_after_run(
    cost_model: Any, runs_frame: Any, runs: list[Any], recalibrate: str = "lab.calibrate(cache=False)"
) -> tuple[Any, str | None]:
    """(driver thread) ``cost_model`` refitted to every torch run so far (it models distlab's
    runtime), each run predicted again with it (``refitted_throughput``), and a note when the
    latest ``DRIFT_RUNS`` runs all measured more than ``DRIFT_RATIO`` from their predictions."""
    cost_model = cost_model.refit(runs_frame[runs_frame["backend"] == "torch"])
    for r in runs:
        if r.forecast and r.backend == "torch":
            f = r.forecast
            r.refitted_throughput = float(
                cost_model.predict(f.profile, f.resources, r.strategy, optimizer=f.optimizer).throughput
            )
    done = [r for r in runs if r.status == "finished" and r.forecast][-DRIFT_RUNS:]
    ratios = [r.throughput / r.predicted_throughput for r in done]
    if (
        len(ratios) == DRIFT_RUNS
        and all(x == x for x in ratios)
        and (min(ratios) > DRIFT_RATIO or max(ratios) < 1 / DRIFT_RATIO)
    ):
        return cost_model, (
            f"lab: the last {DRIFT_RUNS} runs measured {min(ratios):.2f}-{max(ratios):.2f}x their "
            "predicted throughput; lab.cost_model was refitted to every run so far (lab.runs shows both "
            f"predictions); if other programs were busy when it was calibrated, run {recalibrate} on a "
            "quiet machine"
        )
    return cost_model, None
