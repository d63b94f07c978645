"""The calibration's measurements on the workers: the collectives on every link
(``measure_links``), each model's local step (``measure_models``) and the real training loop on
the reference models (``measure_training_loop``), and the progress bar they move. What each
measurement fits is described in docs/cost-model.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distlab.calibration.progress import Progress
from distlab.calibration.repeat import LINK_REPEATS, link_figures, mean_rows, pass_figures, stage_spread
from distlab.costmodel.calibrate import fit_compute
from distlab.costmodel.compute import compute_rows, model_key
from distlab.costmodel.rows import ComputeFitRow, LocalStep, LoopRun, overhead_features
from distlab.errors import CalibrationError, LaunchError
from distlab.runs.metrics import slowest_median
from distlab.runtime.loopbench import (
    LOCAL_MAX_STEPS,
    LocalCase,
    LoopCase,
    loop_pass_rank,
)
from distlab.runtime.microbench import COLLECTIVES, DEFAULT_SIZES, microbench_worlds

if TYPE_CHECKING:
    from distlab.cluster.cluster import Cluster
    from distlab.costmodel.model import CostModel
    from distlab.profiling.model_profile import ModelProfile

# seconds of microbenchmarks a repeat may take at most (a LocalCluster's end well within it)
CALIBRATION_BUDGET = 20.0
OVERHEAD_STEPS = 10  # steps of a short training-loop case in one pass
# cases predicted shorter than SHORT_STEP run OVERHEAD_PASSES passes over every world size in turn,
# the longer ones one pass of LONG_STEPS: a step of a few milliseconds is at the mercy of a shared
# machine's moments, one of 100 ms is not (evidence: docs/cost-model.md §History and evidence)
SHORT_STEP, OVERHEAD_PASSES, LONG_STEPS = 0.02, 3, 6
# a user's model's local step is the figure every prediction for it starts from, so it gets more of
# the machine's moments than a reference model's: MODEL_PASSES passes over the world sizes, each
# stepping for LOCAL_SECONDS, at most MODEL_MAX_STEPS steps (evidence: docs/cost-model.md
# §History and evidence)
MODEL_PASSES, LOCAL_SECONDS, MODEL_MAX_STEPS = 8, 0.4, 1000
# a model stage expected to last longer than ANNOUNCE_AFTER seconds says so, in a line, before it starts
ANNOUNCE_AFTER = 20.0


def ranks_label(worlds: Sequence[int]) -> str:
    """``2 ranks``, ``1 rank``, ``2-4 ranks``: the world sizes a part measures."""
    lo, hi = min(worlds), max(worlds)
    return f"{hi} rank{'s' if hi > 1 else ''}" if lo == hi else f"{lo}-{hi} ranks"


def measure_links(
    cluster: Cluster, sizes: Any = None, bar: Progress | None = None, repeats: int = LINK_REPEATS
) -> Any:
    """The first stage of a calibration alone: every collective at ``sizes`` (bytes; None:
    ``DEFAULT_SIZES``) on every world size of ``cluster``, ``repeats`` times, each point's mean
    over the repeats fitted to an alpha-beta per collective and link class (within a host, between
    hosts). A ``CostModel`` whose compute and training loop are the defaults: what the links cost,
    in about ``CALIBRATION_BUDGET`` seconds; its ``fingerprint["repeatability"]`` holds the stage's
    spread over the repeats (calibration/repeat.py)."""
    from distlab.costmodel import CostModel
    from distlab.costmodel.calibrate import fit_microbenchmarks
    from distlab.costmodel.params import CostParams

    res = cluster.resources
    if res.world < 2:
        raise CalibrationError(
            f"calibrate: the Lab has {res.world} worker; collectives need 2 or more (Lab(workers=2))"
        )
    bar = bar or Progress(1, f"measuring links on {res.world} ranks", False)
    worlds = list(range(2, res.world + 1))
    # each repeat has the whole budget: it only bounds a slow link's sizes (the largest run last and are
    # the ones a budget cuts), and a LocalCluster's collectives end well within it
    budget = CALIBRATION_BUDGET
    runs = []
    for i in range(repeats):
        bar.start(f"collectives at {ranks_label(worlds)}, repeat {i + 1} of {repeats}")
        try:
            out = cluster.run_ranks(
                microbench_worlds,
                list(sizes) if sizes else None,
                worlds,
                budget,
                cluster.timeout,
                timeout=budget + 2 * cluster.timeout,
                on_tick=bar.ticks(len(worlds) * len(sizes or DEFAULT_SIZES) * len(COLLECTIVES)),
            )
        except LaunchError as exc:
            raise CalibrationError(f"calibrate: microbenchmarks failed: {exc}") from None
        runs.append(out[0])
        bar.done()
    cm = CostModel.from_microbenchmarks(mean_rows(runs), res)
    fits = []
    for rows in runs:  # each repeat fitted alone: how far its predictions lie from the others'
        try:
            fits.append(fit_microbenchmarks(rows, CostParams())[0])
        except CalibrationError:
            continue  # a repeat with too few points to fit says nothing of the spread
    found = stage_spread("collectives", link_figures(fits, res.world))
    return cm.with_params(cm.params, repeatability=[found.to_dict()] if found else [])


def reference_fit_rows(profiles: Sequence[Any], local: Sequence[LocalStep]) -> list[ComputeFitRow]:
    """Local steps of the reference models beside their profiles (fit_compute's rows)."""
    by_key = {model_key(p): p for p in profiles}
    return [ComputeFitRow.of(r, by_key[r.key]) for r in local]


def model_cases(targets: Sequence[tuple[str, Any, Any, Sequence[int], Any]]) -> list[LocalCase]:
    """The model stage's cases: each target at each of its batches, in order."""
    return [LocalCase(m, data, b, loss) for _, m, data, batches, loss in targets for b in batches]


def plan_models(
    cluster: Cluster,
    targets: Sequence[tuple[str, Any, Any, Sequence[int], Any]],
    worlds: Any,
    passes: int = MODEL_PASSES,
    doing: str = "calibrating {names}",
    before: float = 0.0,
) -> Any:
    """The model stage's expected time (``estimate.StageEstimate``), from one step of each case
    measured first; a stage expected to last past ``ANNOUNCE_AFTER`` seconds says how long the
    call will (``before``: the seconds of its stages ahead of this one) in one line (``doing``,
    its ``{names}`` the models'): "distlab: calibrating transformer_lm will take about 4 minutes
    (its step is 2.1 s at batch 32)"."""
    from distlab.calibration.estimate import about, estimate_stage
    from distlab.runs.report import model_name

    names = ", ".join(dict.fromkeys(model_name(m) for _, m, _, _, _ in targets))
    cases = model_cases(targets)
    try:
        plan = estimate_stage(cluster, cases, sorted(set(worlds)), passes, LOCAL_SECONDS, MODEL_MAX_STEPS)
    except Exception as exc:  # noqa: BLE001 - the model's own error, as a rank's would be named
        first = (str(exc).splitlines() or [""])[0][:240]
        raise CalibrationError(
            f"calibrate: {names}'s first step failed: {type(exc).__name__}: {first}"
        ) from None
    if plan.seconds >= ANNOUNCE_AFTER:
        slowest = max(range(len(cases)), key=lambda i: plan.first[i])
        print(
            f"distlab: {doing.format(names=names)} will take {about(before + plan.seconds)} (its step "
            f"is {plan.first[slowest]:.2g} s at batch {cases[slowest].batch})",
            flush=True,
        )
    return plan


def measure_models(
    cluster: Cluster,
    targets: Sequence[tuple[str, Any, Any, Sequence[int], Any]],
    worlds: Any,
    passes: int = MODEL_PASSES,
    bar: Progress | None = None,
    plan: Any = None,
) -> list[LocalStep]:
    """Each target's local step at each world size and batch (runtime.loopbench.loop_pass_rank,
    with every rank of the world busy): compute rows. One call per world size and pass, the
    world sizes in turn pass after pass (each pass in the other direction), so a slow minute
    of the machine hits every world size a little; each row the median of its steps over the passes.
    ``bar`` advances once a call (``passes * len(worlds)`` in all), within a call with the
    call's expected time (``plan``: ``plan_models``' estimate; None: made here)."""
    from distlab.runs.report import model_name

    res = cluster.resources
    bar = bar or Progress(0, "", False)
    worlds = sorted(set(worlds))
    names = ", ".join(dict.fromkeys(model_name(m) for _, m, _, _, _ in targets))
    cases = model_cases(targets)
    keys = [k for k, _, _, batches, _ in targets for _ in batches]
    if plan is None:
        bar.start(f"one step of {names} (for an estimate)")
        plan = plan_models(cluster, targets, worlds, passes)
    steps: dict[int, list[list[list[float]]]] = {k: [[[] for _ in cases] for _ in range(k)] for k in worlds}
    for turn in range(passes):
        for k in worlds if turn % 2 == 0 else worlds[::-1]:
            threads = cluster.threads_for(cluster.first(k, res), res)  # as a k-rank run gets
            what = f"local step of {names} at {ranks_label([k])}, pass {turn + 1} of {passes}"
            bar.start(what, plan.calls[k])
            try:
                per_rank = cluster.run_ranks(
                    loop_pass_rank,
                    cases,
                    threads,
                    [],
                    cluster.timeout,
                    LOCAL_SECONDS,
                    MODEL_MAX_STEPS,
                    res.gpus,
                    world=k,
                    on_tick=bar.ticks(len(cases)),
                )
            except LaunchError as exc:
                raise CalibrationError(
                    f"calibrate: the local-step stage failed at world {k}: {exc}"
                ) from None
            for r, (own, _) in enumerate(per_rank):
                for i, seconds in enumerate(own):
                    steps[k][r][i].extend(seconds)
            bar.done()
    return _local_rows(res, keys, [c.batch for c in cases], steps)


def _local_rows(
    res: Any, keys: Sequence[str], batches: Sequence[int], steps: dict[int, list[list[list[float]]]]
) -> list[LocalStep]:
    """Compute rows from each world size's steps per rank per case (cases with no steps yet left
    out): each the median over steps of the slowest rank's, as a run's throughput is timed."""
    rows = []
    for k, per_rank in steps.items():
        measured = [i for i in range(len(keys)) if all(r[i] for r in per_rank)]
        seconds = [[slowest_median([r[i] for r in per_rank]) for i in measured]]
        ranks, cores = local_point(res, k)
        rows.extend(
            compute_rows([keys[i] for i in measured], [batches[i] for i in measured], seconds, ranks, cores)
        )
    return rows


def local_point(res: Any, world: int) -> tuple[int, int | None]:
    """(ranks on the first host, its cores) of a ``world``-rank run of ``res``: what a local-step row
    measured at that world size is filed under (on several hosts, worlds 2 to 4 of 2+2 ranks are all
    2 ranks on the first host)."""
    host = res.ranks[0].host
    return sum(1 for r in res.ranks[:world] if r.host == host), res.cores.get(host)


def _repeats(predicted: float) -> tuple[int, int]:
    """(steps, passes) of a training-loop case predicted to take ``predicted`` seconds a step."""
    return (OVERHEAD_STEPS, OVERHEAD_PASSES) if predicted < SHORT_STEP else (LONG_STEPS, 1)


def loop_parts(worlds: Sequence[int]) -> int:
    """The most calls measure_training_loop makes at ``worlds``: one per pass and world size."""
    return OVERHEAD_PASSES * len(worlds)


def measure_training_loop(
    cluster: Cluster,
    cm: Any,
    res: Any,
    cases: Sequence[Any],
    profiles: Sequence[Any],
    worlds: Sequence[int],
    bar: Progress | None = None,
) -> Any:
    """The real training loop on the reference models and builders at ``worlds``, each pass beside
    the models' own local steps (runtime.loopbench.loop_pass_rank); returns ``cm`` fitted to them:
    compute (fit_compute) and the loop's cost (fit_overhead: the in-step seconds measured against
    what ``cm`` predicts with each model's local step of the same passes). ``bar`` advances once a
    call, and past the calls that short cases did not need: ``loop_parts(worlds)`` in all.

    Long because its schedule is one loop over shared tables: passes alternate direction over the world
    sizes, and the short cases are planned again after the first pass."""
    import distlab as dl

    bar = bar or Progress(0, "", False)
    left = loop_parts(worlds)
    plans, subs, threads = {}, {}, {}
    for k in worlds:
        subs[k] = res.first(k)
        threads[k] = cluster.threads_for(cluster.first(k, res), res)  # as a k-rank run gets
        plans[k] = [
            (j, dl.strategy.build(builder, p, subs[k], batch_size=b))
            for j, (p, (_, _, b, builders)) in enumerate(zip(profiles, cases))
            for builder in builders
            if builder != "Gossip" or k > 1  # gossip needs a neighbour
        ]

    def repeats(model: Any) -> dict[int, list[tuple[int, int]]]:
        return {
            k: [_repeats(model.predict(profiles[j], subs[k], s).step_time) for j, s in plans[k]]
            for k in worlds
        }

    reps = repeats(cm)  # the first pass: every case, its steps from the profiles' compute
    local: dict[int, list[list[list[float]]]] = {k: [[[] for _ in cases] for _ in range(k)] for k in worlds}
    steps: dict[int, list[list[list[float]]]] = {
        k: [[[] for _ in plans[k]] for _ in range(k)] for k in worlds
    }
    # each figure pass by pass (the slowest rank's median step), for the stage's repeatability
    local_passes: dict[str, list[float]] = {}
    loop_passes: dict[str, list[float]] = {}
    # pass after pass over the world sizes (each pass in the other direction), so the passes of a
    # world size's cases lie apart in time and a slow minute of the machine hits every world size
    # a little, not one of them wholly (evidence: docs/cost-model.md §History and evidence)
    turn = 0
    while turn < max(n for k in worlds for _, n in reps[k]):
        for k in worlds if turn % 2 == 0 else worlds[::-1]:
            due = [i for i, (_, n) in enumerate(reps[k]) if turn < n]
            if not due:
                continue
            models = sorted({plans[k][i][0] for i in due})
            bar.start(f"training loop at {ranks_label([k])}, pass {turn + 1} ({len(due)} runs)")
            jobs = []
            for i in due:
                j, strategy = plans[k][i]
                model, data, batch, _ = cases[j]
                jobs.append(LoopCase(model, strategy, data, batch, reps[k][i][0], 1))  # one pass now
            try:
                per_rank = cluster.run_ranks(
                    loop_pass_rank,
                    [LocalCase(*cases[j][:3]) for j in models],
                    threads[k],
                    jobs,
                    cluster.timeout,
                    0.0,
                    LOCAL_MAX_STEPS,
                    res.gpus,
                    world=k,
                    on_tick=bar.ticks(len(models) + len(jobs)),
                )
            except LaunchError as exc:
                raise CalibrationError(
                    f"calibrate: the training-loop stage failed at world {k}: {exc}"
                ) from None
            for r, (own, loop) in enumerate(per_rank):
                for n, j in enumerate(models):
                    local[k][r][j].extend(own[n])
                for n, i in enumerate(due):
                    steps[k][r][i].extend(loop[n])
            for n, j in enumerate(models):
                figure = f"reference {j} ({type(cases[j][0]).__name__}) at {ranks_label([k])}"
                local_passes.setdefault(figure, []).append(_pass_step([own[n] for own, _ in per_rank]))
            for n, i in enumerate(due):
                j, strategy = plans[k][i]
                figure = f"{strategy.name} on reference {j} at {ranks_label([k])}"
                loop_passes.setdefault(figure, []).append(_pass_step([loop[n] for _, loop in per_rank]))
            bar.done()
            left -= 1
        if turn == 0:  # the later passes: the cases short by the local steps now measured
            reps = repeats(_with_local(cm, profiles, cases, res, local))
        turn += 1
    bar.done(left)  # the passes the cases did not need
    cm = _with_local(cm, profiles, cases, res, local)
    rows = [
        LoopRun(
            **overhead_features(cm, profiles[j], subs[k], s),
            measured=slowest_median([r[i] for r in steps[k]]),  # as run.throughput times it
        )
        for k in worlds
        for i, (j, s) in enumerate(plans[k])
    ]
    cm = cm.with_overhead(rows)
    found = [
        spread.to_dict()
        for spread in (
            stage_spread("reference models' local steps", pass_figures(local_passes)),
            stage_spread("training loop", pass_figures(loop_passes)),
        )
        if spread is not None
    ]
    return cm.with_params(cm.params, repeatability=[*cm.fingerprint.get("repeatability", []), *found])


def _pass_step(per_rank: Sequence[Sequence[float]]) -> float:
    """One pass's figure: the slowest rank's median step (0, left out, when the ranks' steps do not align)."""
    try:
        return slowest_median(per_rank)
    except ValueError:
        return 0.0


def _with_local(
    cm: CostModel,
    profiles: Sequence[ModelProfile],
    cases: Sequence[Any],
    res: Any,
    local: dict[int, list[list[list[float]]]],
) -> Any:
    """``cm`` with the reference models' local steps measured so far: compute fitted to them
    (fit_compute) and their own steps in its compute table."""
    rows = _local_rows(res, [model_key(p) for p in profiles], [c[2] for c in cases], local)
    params = fit_compute(cm.params, reference_fit_rows(profiles, rows))
    return cm.with_params(params, local_steps=[r.to_dict() for r in rows]).with_compute(rows)
