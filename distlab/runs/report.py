"""What runs report: a run's row of ``lab.runs`` (the columns and what they mean) and its card in a
notebook."""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distlab.runs.run import Run

RUN_COLUMNS = (
    "run_id",
    "model",
    "backend",
    "strategy",
    "world",
    "batch",
    "steps",
    "status",
    "restarts",
    "measured_throughput",
    "predicted_throughput",
    "refitted_throughput",
    "model_key",
    "per_replica",
    "measured_step",
    "predicted_compute",
    "predicted_comm",
    "predicted_optimizer",
    "prediction_basis",
    "prediction_notes",
)


def model_name(model: Any) -> str:
    """A run's model in ``lab.runs``: a Keras model's own name, a torch module's class."""
    name = getattr(model, "name", None)
    return name if isinstance(name, str) and name else type(model).__name__


def run_row(run: Run, model: str) -> dict[str, Any]:
    """``run``'s row of ``runs_frame`` (``model``: its model's name)."""
    tp = run.throughput
    base = run.forecast.base if run.forecast else None
    return {
        "run_id": run.id,
        "model": model,
        "backend": run.backend,
        "strategy": run.strategy.name,
        "world": run.world,
        "batch": run.batch_size,
        "steps": run.steps,
        "status": run.status,
        "restarts": run.restarts,
        "measured_throughput": tp,
        "predicted_throughput": run.predicted_throughput,
        "refitted_throughput": run.refitted_throughput,
        "model_key": run.forecast.model_key if run.forecast else None,
        "per_replica": run.batch_size,
        "measured_step": run.batch_size * run.world / tp if tp and tp == tp else math.nan,
        "predicted_compute": base.breakdown["compute"] if base is not None else math.nan,
        "predicted_comm": base.breakdown["comm"] if base is not None else math.nan,
        "predicted_optimizer": base.breakdown["optimizer"] if base is not None else math.nan,
        "prediction_basis": base.basis if base is not None else None,
        "prediction_notes": "; ".join(base.notes) if base is not None else "",
    }


def runs_frame(runs: list[Run]) -> Any:
    """One row per run: run_id, model, strategy, world, batch, steps, status, restarts;
    ``measured_throughput``; ``predicted_throughput`` (made before the run, by the cost model
    refitted on the runs before it); ``refitted_throughput`` (refitted on every run so far);
    and what ``CostModel.refit`` reads: ``model_key``, ``per_replica``, ``measured_step`` and
    the calibration's own ``predicted_compute``/``comm``/``optimizer`` seconds."""
    import pandas as pd

    return pd.DataFrame([r.row() for r in runs], columns=list(RUN_COLUMNS))


def _no_prediction(run: Run) -> str:
    """Why a run has no prediction, and the call that gives the next one."""
    if run.forecast:
        return ""
    return run.route.no_prediction(run)


def _prediction_text(run: Run, pred: float) -> str:
    """The card's predicted figure with what it rests on: ``1,234 samples/s (before the run, from
    the measured step, typically within 10%)`` and any note (uncalibrated, profiled under load)."""
    base = run.forecast.base if run.forecast else None
    if base is None or not hasattr(base, "basis_text"):
        return f"{pred:,.0f} samples/s (before the run)"
    return f"{pred:,.0f} samples/s (before the run, {base.basis_text()})" + "".join(
        f"; {n}" for n in base.notes
    )


def _metrics_text(run: Run) -> str:
    """A compiled Keras model's metrics at the last step (mean over ranks), as ``fit`` logs them."""
    from distlab.step_metrics import describe

    names = run.metric_names
    m = run.metrics
    if not names or not len(m):
        return describe(run.step_metrics)
    last = m[m["step"] == m["step"].max()]
    values = ", ".join(f"{n} {last[n].mean():.4g}" for n in names if n in last)
    return f"{values} at the last step ({describe(run.step_metrics)})"


def run_card(run: Run) -> str:
    """``run`` as an HTML table: status, strategy, steps, data, loss, throughput measured and
    predicted, where the trained model is, the checkpoint and any error."""
    r = run.row()
    tp, pred = r["measured_throughput"], r["predicted_throughput"]
    losses = run.losses
    loss = (float(losses.iloc[0]), float(losses.iloc[-1])) if len(losses) else None
    done = run.status == "finished"
    restarts = f", {r['restarts']} restart(s)" if r["restarts"] else ""
    rows = [
        ("status", r["status"]),
        ("strategy", f"{r['strategy']} on {r['world']} worker(s), {r['batch']} samples per replica"),
        ("steps", f"{run.steps_done}{f'/{run.steps}' if run.steps else ' (your loop ends it)'}{restarts}"),
        ("data", run.data_info),
        ("loss", run.loss_info + (f": {loss[0]:.4g} first step, {loss[1]:.4g} last" if loss else "")),
        ("optimizer", run.optimizer_info),
        ("metrics", _metrics_text(run)),
        ("throughput", f"{tp:,.0f} samples/s measured" if tp == tp else "-"),
        ("predicted", _prediction_text(run, pred) if pred == pred else _no_prediction(run)),
        ("trained model", f"{run.var_name}.model (rank 0's weights, on the CPU)" if done else ""),
        ("checkpoint", _checkpoint_text(run)),
        ("error", str(run.error) if run.error else ""),
    ]
    cells = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{k}</th><td style='text-align:left'>"
        f"{html.escape(str(v))}</td></tr>"
        for k, v in rows
        if v != ""
    )
    return f"<p><b>Run {html.escape(run.id)}</b></p><table class='distlab-run'>{cells}</table>"


def _checkpoint_text(run: Any) -> str:
    """When the last checkpoint was taken (elastic runs), and whether it is still on disk."""
    from distlab.runs import ckpt_dirs

    ended = run.status in ("finished", "failed", "cancelled")
    path = None if ended else run.checkpoint
    info = run.last_checkpoint if ended else ckpt_dirs.last(Path(path).parent) if path else None
    return ckpt_dirs.describe(info, ended)


def lab_card(res: Any, runs: int, cost_model: str, checkpoint_dir: Any) -> str:
    """A live Lab's card in a notebook: its workers (one row each), runs, cost model and checkpoints."""
    import html

    rows = "".join(
        f"<tr><td>{r.rank}</td><td>{html.escape(r.host)}</td><td>{html.escape(r.device)}</td>"
        f"<td>{html.escape(a)}</td></tr>"
        for r, a in zip(res.ranks, res.addresses)
    )
    return (
        f"<p><b>Lab</b>: {res.world} workers on {res.num_hosts} host(s); {runs} runs; cost model "
        f"{cost_model}; checkpoints in {html.escape(str(checkpoint_dir))} "
        "(one per running run, removed when it ends)</p>"
        f"<table><tr><th>rank</th><th>host</th><th>device</th><th>worker</th></tr>{rows}</table>"
    )
