"""CostModel.refit: per-model corrections fitted to finished runs, on synthetic runs and on the recorded
accuracy grids."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import distlab as dl
from distlab import zoo
from distlab.costmodel import CostModel
from distlab.costmodel.compute import model_key
from distlab.costmodel.refit import Correction, apply, fit_corrections
from distlab.errors import CalibrationError, DistlabError

MEASUREMENTS = Path(__file__).resolve().parents[2] / "datasets" / "measurements"
GRID = "cost-model-accuracy-2026-11-23n"
# the grid's models and builders (notebooks/bench/cost-model-accuracy.ipynb)
GRID_MODELS = {
    "mlp": {"width": 512},
    "convnet": {},
    "transformer_lm": {"layers": 2, "d_model": 128, "vocab_size": 2048, "seq_len": 32},
    "wide_deep": {"rows": 50000},
}
GRID_BUILDERS = [
    ("AllReduce", {}),
    ("PS", {}),
    ("PSLoadBalancing", {}),
    ("PartitionedPS", {}),
    ("Parallax", {}),
    ("Gossip", {"topology": "exp2"}),
    ("Gossip", {"topology": "one_peer_exp2"}),
]


def synthetic(name="dense", width=1000, time_per_sample=1e-3):
    return dl.ModelProfile.from_variables(
        [(f"{name}.w1", (width, width)), (f"{name}.b1", (width,)), (f"{name}.w2", (width, 10))],
        time_per_sample=time_per_sample,
    )


def allreduce(prof, world, batch):
    res = dl.ResourceSpec.local(workers=world)
    return res, dl.strategy.build("AllReduce", prof, res, batch_size=batch)


def run_row(cm, prof, world, batch, compute_factor=1.5, comm_factor=1.0):
    """A finished run of ``prof`` under AllReduce that measured ``compute_factor`` x the predicted compute."""
    res, st = allreduce(prof, world, batch)
    b = cm.predict(prof, res, st, optimizer="sgd").breakdown
    return {
        "model_key": model_key(prof),
        "world": world,
        "per_replica": batch,
        "strategy": st.name,
        "status": "finished",
        "measured_step": compute_factor * b["compute"] + comm_factor * (b["comm"] + b["optimizer"]),
        "predicted_compute": b["compute"],
        "predicted_comm": b["comm"],
        "predicted_optimizer": b["optimizer"],
    }


def test_refit_moves_the_model_toward_its_runs_and_leaves_other_models_alone():
    cm, prof, other = CostModel.default(), synthetic(), synthetic("other", width=800)
    runs = pd.DataFrame([run_row(cm, prof, w, b) for w in (2, 3) for b in (8, 32) for _ in range(3)])
    new = cm.refit(runs)
    fix = new.refits[model_key(prof)]
    assert fix.compute == pytest.approx(1.5, rel=0.05) and fix.comm == pytest.approx(1.0, abs=0.1)
    assert fix.runs == 12 and fix.error_after < 0.02 < fix.error_before
    for w, b in ((2, 8), (3, 32)):  # the configurations that ran: within a few % of what they measured
        res, st = allreduce(prof, w, b)
        measured = run_row(cm, prof, w, b)["measured_step"]
        assert new.predict(prof, res, st, optimizer="sgd").step_time == pytest.approx(measured, rel=0.03)
    # another world and batch of the same model: moved the same way (slower), most of the way
    res, st = allreduce(prof, 4, 16)
    before, after = cm.predict(prof, res, st, optimizer="sgd"), new.predict(prof, res, st, optimizer="sgd")
    measured = run_row(cm, prof, 4, 16)["measured_step"]
    assert before.step_time < after.step_time and abs(after.step_time / measured - 1) < 0.05
    assert after.throughput == pytest.approx(before.throughput * before.step_time / after.step_time)
    assert after.step_time == pytest.approx(sum(after.breakdown.values()))
    assert sum(
        after.detail[k] for k in ("backward", "sparse", "broadcast", "gossip", "calls")
    ) == pytest.approx(after.breakdown["comm"])
    # every path a prediction takes: rank, evaluate_many, the what-if sweep
    row = new.rank(prof, res, [st], optimizer="sgd").iloc[0]
    assert row["step_time"] == after.step_time and row["compute"] == after.breakdown["compute"]
    assert new.evaluate_many(prof, res, [st], "sgd")["step_time"][0] == after.step_time
    swept = new.sweep(prof, res, [st], worlds=[2, 4], optimizer="sgd")
    base = cm.sweep(prof, res, [st], worlds=[2, 4], optimizer="sgd")
    assert np.allclose(swept["compute"], base["compute"] * fix.compute)
    assert np.allclose(swept["step_time"], swept[["compute", "comm", "optimizer"]].sum(axis=1))
    # a model without runs: bit for bit as before, whether alone or ranked beside a corrected one
    res, st_other = allreduce(other, 2, 8)
    assert new.predict(other, res, st_other) == cm.predict(other, res, st_other)
    assert new.sweep(other, res, [st_other], worlds=[2, 3]).equals(
        cm.sweep(other, res, [st_other], worlds=[2, 3])
    )
    res, st = allreduce(prof, 2, 8)
    mixed = new.evaluate_compiled([new.compile(other, st_other), new.compile(prof, st)], res)
    assert mixed["step_time"][0] == cm.predict(other, res, st_other).step_time
    assert mixed["step_time"][1] == new.predict(prof, res, st).step_time


def test_one_run_without_communication_is_explained_by_compute():
    cm, prof = CostModel.default(), synthetic()
    # world 1: no comm; the optimizer is a few % of the step
    row = run_row(cm, prof, 1, 32, compute_factor=1.4)
    assert row["predicted_comm"] == 0 and row["predicted_optimizer"] < 0.05 * row["predicted_compute"]
    fix = cm.refit([row]).refits[model_key(prof)]
    # one run: most of the way (the prior holds back the rest), on compute
    assert fix.compute == pytest.approx(1.4, rel=0.03) and fix.comm == pytest.approx(1.0, abs=0.05)
    assert fix.runs == 1 and fix.error_after < 0.03
    # nothing at all on comm or optimizer: its factor has no evidence and stays at exactly 1
    alone = fit_corrections(
        [{**row, "predicted_optimizer": 0.0, "measured_step": 1.4 * row["predicted_compute"]}]
    )
    assert alone[model_key(prof)].comm == 1.0 and alone[model_key(prof)].compute == pytest.approx(
        1.4, rel=0.03
    )
    # one run dominated by comm moves comm, and compute only as much as its share
    share = fit_corrections(
        [
            {
                **row,
                "predicted_compute": 0.1,
                "predicted_comm": 0.9,
                "predicted_optimizer": 0.0,
                "measured_step": 1.5,
            }
        ]
    )
    fix = share[model_key(prof)]
    assert fix.comm > 1.4 and (fix.compute - 1) == pytest.approx((fix.comm - 1) * 0.1 / 0.9, rel=1e-6)


def test_factors_are_bounded_and_outliers_do_not_drag_the_fit():
    row = {"model_key": "m", "predicted_compute": 1.0, "predicted_comm": 0.0, "predicted_optimizer": 0.0}
    assert fit_corrections([{**row, "measured_step": 10.0}] * 20)["m"].compute == 5.0
    assert fit_corrections([{**row, "measured_step": 0.1}] * 20)["m"].compute == 0.2
    # nine runs 10% slow and one 3x slow: the one barely moves the fit
    runs = [{**row, "measured_step": 1.1}] * 9 + [{**row, "measured_step": 3.0}]
    assert fit_corrections(runs, halflife=None)["m"].compute == pytest.approx(1.1, abs=0.02)
    # ... or one 3x fast (relative to its measured step it errs by 200%): bounded, still above 1
    # (plain least squares would go to 0.68)
    runs = [{**row, "measured_step": 1.1}] * 9 + [{**row, "measured_step": 1 / 3}]
    assert 1.0 < fit_corrections(runs, halflife=None)["m"].compute < 1.1


def test_recent_runs_weigh_more():
    row = {"model_key": "m", "predicted_compute": 1.0, "predicted_comm": 0.0, "predicted_optimizer": 0.0}
    runs = [{**row, "measured_step": 1.3}] * 40 + [{**row, "measured_step": 1.1}] * 40
    alike = fit_corrections(runs, halflife=None)["m"].compute
    recent = fit_corrections(runs)["m"].compute
    earlier = fit_corrections(runs[::-1])["m"].compute
    assert 1.15 < alike < 1.25
    assert recent < 1.15 and earlier > 1.2  # the machine is now as the last runs found it


def test_refit_is_pure_and_refitting_combines():
    cm, prof, other = CostModel.default(), synthetic(), synthetic("other", width=800)
    res, st = allreduce(prof, 2, 8)
    before = cm.predict(prof, res, st)
    runs1 = [run_row(cm, prof, 2, b) for b in (8, 32)]
    runs2 = [run_row(cm, prof, 3, 16, compute_factor=1.2)] + [run_row(cm, other, 2, 8, comm_factor=2.0)]
    once = cm.refit(runs1)
    assert cm.refits == {} and cm.predict(prof, res, st) == before  # the original is unchanged
    assert once.refits == cm.refit(runs1).refits  # deterministic
    assert once.refit(runs1).refits == once.refits  # the same runs again: the same model
    both = cm.refit(runs1 + runs2)
    assert once.refit(runs1 + runs2).refits == both.refits
    assert both.predict(prof, res, st) == once.refit(runs1 + runs2).predict(prof, res, st)
    # a model without new runs keeps its correction
    assert both.refit(runs1).refits[model_key(other)] == both.refits[model_key(other)]
    assert once.without_refit().refits == {} and once.without_refit().predict(prof, res, st) == before
    # derived models keep the correction
    assert once.with_params(cm.params).refits == once.refits


def test_bad_and_empty_runs():
    cm, prof = CostModel.default(), synthetic()
    row = run_row(cm, prof, 2, 8)
    with pytest.raises(CalibrationError, match=r"runs: missing column 'predicted_compute'.*lab\.runs"):
        cm.refit(pd.DataFrame([{k: v for k, v in row.items() if k != "predicted_compute"}]))
    with pytest.raises(CalibrationError, match=r"missing columns 'model_key', 'measured_step'"):
        fit_corrections([{"predicted_compute": 1.0, "predicted_comm": 0.0, "predicted_optimizer": 0.0}])
    for empty in ([], pd.DataFrame(), pd.DataFrame(columns=["model_key", "measured_step"])):
        new = cm.refit(empty)
        assert new.refits == {} and new is not cm
    res, st = allreduce(prof, 2, 8)
    assert cm.refit([]).predict(prof, res, st) == cm.predict(prof, res, st)
    # unusable rows are skipped: failed or unfinished runs, missing or non-positive figures
    skipped = [
        {**row, "status": "failed"},
        {**row, "status": "running"},
        {**row, "measured_step": math.nan},
        {**row, "measured_step": 0.0},
        {**row, "predicted_comm": None},
        {**row, "predicted_compute": -1.0},
        {**row, "model_key": None},
    ]
    assert fit_corrections(skipped) == {}
    assert fit_corrections([*skipped, row])[model_key(prof)].runs == 1
    with pytest.raises(CalibrationError, match="prior"):
        fit_corrections([row], prior=0.0)
    with pytest.raises(CalibrationError, match="halflife"):
        fit_corrections([row], halflife=0)
    assert issubclass(CalibrationError, DistlabError)


def test_save_load_round_trip_keeps_corrections(tmp_path):
    cm, prof = CostModel.default(), synthetic()
    new = cm.refit([run_row(cm, prof, w, 8) for w in (1, 2)])
    loaded = CostModel.load(new.save(tmp_path / "cm.json"))
    assert loaded.refits == new.refits and isinstance(loaded.refits[model_key(prof)], Correction)
    res, st = allreduce(prof, 2, 32)
    assert loaded.predict(prof, res, st) == new.predict(prof, res, st)
    assert new.to_dict()["refit"][model_key(prof)]["compute"] == new.refits[model_key(prof)].compute
    # files written before refit existed load, uncorrected
    d = new.to_dict()
    del d["refit"]
    (tmp_path / "old.json").write_text(json.dumps(d))
    assert CostModel.load(tmp_path / "old.json").refits == {}
    with pytest.raises(CalibrationError, match="refit correction"):
        Correction.from_dict({"comm": 1.0})


def test_apply_keeps_untouched_entries_bit_for_bit():
    out = {k: np.array([0.1, 0.2]) for k in ("compute", "comm", "optimizer")}
    out["step_time"] = out["compute"] + out["comm"] + out["optimizer"]
    out["throughput"] = 32 / out["step_time"]
    fixed = apply(out, np.array([1.0, 2.0]), np.array([1.0, 0.5]))
    assert all(fixed[k][0] == out[k][0] for k in out)
    assert fixed["step_time"][1] == pytest.approx(0.4 + 0.1 + 0.1)
    assert fixed["throughput"][1] == pytest.approx(32 / 0.6)


# -- recorded runs -------------------------------------------------------------------------------


def held_back_errors(runs: pd.DataFrame) -> pd.DataFrame:
    """Per model: refit on the first half of its runs (in run order), median |error| of the second half before
    and after."""
    order = runs.groupby("model_key").cumcount()
    first = runs[order < runs.groupby("model_key")["model_key"].transform("size") // 2]
    second = runs.drop(first.index)
    fixes = fit_corrections(first)
    sc = second["model_key"].map(lambda k: fixes[k].compute).to_numpy()
    sm = second["model_key"].map(lambda k: fixes[k].comm).to_numpy()
    parts = {
        "compute": second["predicted_compute"].to_numpy(),
        "comm": second["predicted_comm"].to_numpy(),
        "optimizer": second["predicted_optimizer"].to_numpy(),
    }
    parts["step_time"] = parts["compute"] + parts["comm"] + parts["optimizer"]
    corrected = apply(parts, sc, sm)["step_time"]
    y = second["measured_step"].to_numpy()
    table = pd.DataFrame(
        {
            "model": second["model_key"].to_numpy(),
            "before": np.abs(parts["step_time"] / y - 1),
            "after": np.abs(corrected / y - 1),
        }
    )
    return table.groupby("model")[["before", "after"]].median()


def grid_breakdown(calibration: Path) -> pd.DataFrame:
    """Each configuration of the grid re-predicted with its calibration: compute, comm, optimizer.

    The grid recorded only the predicted step. Profiles here are built from the zoo models'
    variables (no timing: the calibration's measured local steps set these models' compute),
    so the split is what the recorded prediction was made of, up to a few %.
    """
    cm = CostModel.load(calibration)
    cores = cm.fingerprint.get("cores") or {"127.0.0.1": 2}
    base = dataclasses.replace(dl.ResourceSpec.local(max(cm.fingerprint.get("worlds") or [4])), cores=cores)
    rows = []
    for name, opts in GRID_MODELS.items():
        net = zoo.get(name, **opts)
        sparse = {f"{m}.weight" for m, mod in net.named_modules() if getattr(mod, "sparse", False)}
        prof = dl.ModelProfile.from_variables(
            [(n, tuple(p.shape), str(p.dtype), n in sparse) for n, p in net.named_parameters()],
            time_per_sample=1e-4,  # any: the calibration's measured local steps replace it
        )
        assert model_key(prof) in cm.compute, f"{name}: not the model the grid calibrated"
        for world in (1, 2, 3, 4):
            res = base.with_world(world)
            cands = []
            for builder, bopts in GRID_BUILDERS:
                for batch in (8, 32):
                    try:
                        cands.append(dl.strategy.build(builder, prof, res, batch_size=batch, **bopts))
                    except DistlabError:
                        continue  # gossip on one rank
            table = cm.rank(prof, res, cands)
            rows += [
                {
                    "model": name,
                    "strategy": r.strategy,
                    "world": world,
                    "batch": r.per_replica,
                    "key": model_key(prof),
                    "compute": r.compute,
                    "comm": r.comm,
                    "optimizer": r.optimizer,
                }
                for r in table.itertuples()
            ]
    return pd.DataFrame(rows)


def test_refit_on_the_recorded_grid_improves_the_held_back_runs():
    """Grid n's runs (1,040, five per configuration), each with the prediction made before it.

    Column mapping: ``measured_step_time`` (the slowest rank per step, median over steps) is
    the measured step; the recorded ``predicted_step_time`` is split into compute, comm and
    optimizer in the proportions the grid's calibration predicts them (``grid_breakdown``).
    """
    runs = pd.read_csv(MEASUREMENTS / f"{GRID}.csv")
    split = grid_breakdown(MEASUREMENTS / f"{GRID}.calibration.json")
    runs = runs.merge(split, on=["model", "strategy", "world", "batch"], how="left", validate="many_to_one")
    assert runs["key"].notna().all(), "every recorded configuration re-predicted"
    scale = runs["predicted_step_time"] / (runs["compute"] + runs["comm"] + runs["optimizer"])
    mapped = pd.DataFrame(
        {
            "model_key": runs["model"],
            "measured_step": runs["measured_step_time"],
            "predicted_compute": runs["compute"] * scale,
            "predicted_comm": runs["comm"] * scale,
            "predicted_optimizer": runs["optimizer"] * scale,
        }
    )
    errors = held_back_errors(mapped)
    overall = errors.mean()
    print(f"\n{GRID}: held-back median |error| per model, before -> after refit (%):")
    print((errors * 100).round(1).to_string())
    print(f"mean over models: {overall['before'] * 100:.1f} -> {overall['after'] * 100:.1f}")
    assert overall["after"] <= overall["before"]


def test_refit_on_every_recorded_grid_from_its_predicted_step_alone():
    """Every recorded grid, with only the predicted step (the whole of it as compute, so the comm factor stays
    1)."""
    grids = sorted(
        p for p in MEASUREMENTS.glob("cost-model-accuracy-*.csv") if not p.name.endswith(".predictions.csv")
    )
    assert len(grids) >= 14
    figures = {}
    for path in grids:
        runs = pd.read_csv(path)
        mapped = pd.DataFrame(
            {
                "model_key": runs["model"],
                "measured_step": runs["measured_step_time"],
                "predicted_compute": runs["predicted_step_time"],
                "predicted_comm": 0.0,
                "predicted_optimizer": 0.0,
            }
        )
        figures[path.stem] = held_back_errors(mapped).mean()
    table = pd.DataFrame(figures).T
    print("\nheld-back median |error|, mean over models, before -> after refit (%):")
    print((table * 100).round(1).to_string())
    mean = table.mean()
    print(f"mean over grids: {mean['before'] * 100:.1f} -> {mean['after'] * 100:.1f}")
    assert mean["after"] < mean["before"]
