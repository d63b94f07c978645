"""What the Lab predicts for a run before it starts, and how it learns from the runs that finished:
the forecast kept with each run, the online refit after each (Pollux refits online), and the
note a user gets when the latest runs all landed far from their predictions."""

from __future__ import annotations

from typing import Any

from distlab.runs.run import Forecast

DRIFT_RUNS, DRIFT_RATIO = 2, 1.3


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
        if r.forecast is not None and r.backend == "torch":
            f = r.forecast
            r.refitted_throughput = float(
                cost_model.predict(f.profile, f.resources, r.strategy, optimizer=f.optimizer).throughput
            )
    done = [r for r in runs if r.status == "finished" and r.forecast is not None][-DRIFT_RUNS:]
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
