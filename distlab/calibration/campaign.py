"""Lab.calibrate(): microbenchmarks and the training loop on the live cluster -> a fitted, cached CostModel.

The stages and what each fits are described in docs/cost-model.md. Long because the calibration's
reference models, its cache and a user's model's measurement share one cache key and one set of
cases; the measuring itself is in measure.py and optimizer_cost.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distlab.calibration import repeat
from distlab.calibration.measure import (
    MODEL_PASSES,
    Progress,
    local_point,
    loop_parts,
    measure_links,
    measure_models,
    measure_training_loop,
    plan_models,
)
from distlab.calibration.optimizer_cost import measure_optimizer_tensors
from distlab.calibration.repeat import LINK_REPEATS
from distlab.costmodel.calibrate import fit_optimizer_tensors
from distlab.costmodel.compute import model_key
from distlab.costmodel.rows import LocalStep
from distlab.errors import CalibrationError, check_positive
from distlab.files import write_atomic
from distlab.runs.report import model_name

if TYPE_CHECKING:
    from distlab.cluster.cluster import Cluster
    from distlab.costmodel.model import CostModel
    from distlab.resources import ResourceSpec

# the local steps and training loop: two tiny MLPs (4 and 26 trainable tensors: what a step
# costs besides arithmetic), a wide MLP (megabytes on the wire), a small convnet (how a real
# model's compute slows with ranks sharing cores) and a small wide-and-deep model (sparse tables),
# under the runtime's main paths, at world sizes 1, 2, one less than the whole cluster and the whole
# cluster (on 2 cores: 1 and 2 ranks fit the cores, 3 and 4 take turns, each in its own way)
OVERHEAD_LAYERS = (1, 12)
OVERHEAD_WIDTH, OVERHEAD_BATCH = 64, 8
# the runtime's paths: buckets (and sparse all-gathers), server reduces, shards, gossip
BUILDERS = ("AllReduce", "PS", "PartitionedPS", "Gossip")
# MLPs of 4.8 MB and 34 MB of gradients in 5 tensors: collectives that move bytes, at the sizes
# of a small model and of one whose exchanges leave the caches (gossip and all-reduce of tens of MB
# cost more a byte than the microbenchmarks' sizes show; evidence: docs/cost-model.md §History)
WIDE_WIDTHS = (768, 2048)
HEAVY = ("convnet", {"width": 16}, 16)  # zoo model, options, per-replica batch
# an MLP of 17 MB of gradients in 4 MiB buckets at a batch whose backward lasts as long as their
# all-reduce: what the buckets overlapping backward cost on this host pins CostParams.overlap_loss
OVERLAP_LAYERS, OVERLAP_WIDTH, OVERLAP_BATCH = 4, 1024, 32
SPARSE = ("wide_deep", {"rows": 2000}, 16)  # sparse tables: many small collective calls per step
# bump when what a cached calibration holds changes; history: docs/cost-model.md, Calibration formats
CALIBRATION_FORMAT = 24
MODEL_BATCH = 32  # calibrate(models=...): per-replica batches measured are this and a quarter of it
# seconds of the stages before the models' per world size of the training-loop stage: collectives,
# the reference models' profiles and the loop, what an announced estimate adds for them. A quiet
# 2-worker LocalCluster here took 19 s (3 + 2 + 14, 2026-11-29); the 60 s once assumed for all of
# them made the README's calibration announce "about 80 s" and take 35
CLUSTER_SECONDS_PER_WORLD = 10.0
# what the kernel's interrupt says, as an interrupted run.wait() does; nothing is cached
INTERRUPTED = "{what} interrupted: cancelled on every worker"


def cache_key(resources: Any, sizes: Any) -> str:
    """Hosts, ranks, devices, cores, the sizes asked and library versions: what a calibration depends on."""
    versions = {}
    for lib in ("distlab", "torch", "numpy", "distributed"):
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    fp = {
        "format": CALIBRATION_FORMAT,
        "ranks": [[r.host, r.device] for r in resources.ranks],
        "cores": dict(sorted(resources.cores.items())),
        "sizes": list(sizes) if sizes else None,
        "versions": versions,
    }
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def calibrate_cluster(
    cluster: Cluster,
    cache_dir: Path,
    sizes: Any = None,
    cache: bool = True,
    progress: bool = True,
    models: Sequence[Any] = (),
    batch_size: int = MODEL_BATCH,
    passes: int = MODEL_PASSES,
) -> Any:
    """Run the microbenchmarks on ``cluster`` (or read the result cached in ``cache_dir``); fit a CostModel.

    ``models``: nn.Modules, or ``(module, dataset)`` / ``(module, dataset, loss)`` tuples, whose
    own step is measured at every world size the Lab allows, at per-replica batches
    ``batch_size`` and ``batch_size // 4``, with every rank busy (compute.py), over ``passes``
    passes; a model measured before on this cluster is read from the cache.

    The host's CPU accounting is watched meanwhile (cluster/load.py): a calibration during which
    other programs used the cores is returned for this session with a ``CalibrationWarning``
    naming them, marked ``fingerprint["disturbed"]``, and never cached; so is one whose repeated
    stages disagree (``fingerprint["unrepeatable"]``, calibration/repeat.py).
    """
    from distlab.cluster.load import LoadMonitor, warn_disturbed, warn_if_workers_changed
    from distlab.costmodel import CostModel

    res = cluster.resources
    if res.world < 2:
        raise CalibrationError(
            f"calibrate: the Lab has {res.world} worker; collectives need 2 or more (Lab(workers=2))"
        )
    targets = _model_cases(models, batch_size)
    path = Path(cache_dir) / f"calibration-{cache_key(res, sizes)}.json"
    cm = None
    if cache and path.exists():
        try:
            cm = CostModel.load(path)
        except CalibrationError:
            pass  # a broken cache file is measured again and overwritten
    todo = [t for t in targets if cm is None or not _measured(cm, t[0], res)]
    if cm is not None and not todo:
        return cm
    worlds = range(1, res.world + 1)
    cases = reference_cases() if cm is None else []
    parts = (_cluster_parts(res, cases) if cm is None else 0) + (passes * len(worlds) if todo else 0)
    bar = Progress(parts, f"calibrating {res.world} ranks", progress)
    monitor = LoadMonitor(cluster.client).start()
    try:
        if todo:  # said before any stage starts: the cluster's own stages take 20 s on 2 workers here
            bar.start("one step of each model (for an estimate)")
            plan = plan_models(cluster, todo, worlds, passes, before=_cluster_seconds(res, cm))
        if cm is None:
            cm = _measure_collectives(cluster, res, sizes, cases, bar)
        if todo:
            cm = cm.with_compute(measure_models(cluster, todo, worlds, passes, bar=bar, plan=plan))
    except KeyboardInterrupt:  # the ranks in flight were ended by the wait on them (cluster/spmd.py)
        raise KeyboardInterrupt(INTERRUPTED.format(what="calibrate")) from None
    finally:
        bar.close()
    loads = monitor.stop()
    warn_if_workers_changed(res, cluster.resources)
    disturbed = warn_disturbed(
        "calibrate",
        loads,
        "these measurements describe that load, not the cluster, so this calibration is used for this "
        "session only and not cached; stop those programs and run lab.calibrate() again",
    )
    worst = repeat.warn_unrepeatable(cm.fingerprint.get("repeatability") or [], said=disturbed)
    cm = cm.with_params(
        cm.params,
        disturbed=disturbed,
        unrepeatable=worst and worst.to_dict(),
        load=[
            {"host": h.host, "cores": h.cores, "foreign": round(h.foreign, 3), "seconds": round(h.seconds, 1)}
            for h in loads
        ],
    )
    if cache and not disturbed and worst is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        cm.save(path)
    return cm


QUICK_PASSES = 2  # a model's step measured before a launch or a simulation: seconds, not a minute


def measure_model(
    cluster: Cluster,
    cache_dir: Path,
    cm: CostModel,
    model: Any,
    data: Any = None,
    loss: Any = None,
    batch_size: int = MODEL_BATCH,
    passes: int = QUICK_PASSES,
    progress: bool = True,
) -> Any:
    """``cm`` (or the default model) plus ``model``'s own local step on ``cluster``'s workers, alone and
    with every rank busy at each world size, at ``batch_size`` and a quarter of it.

    Cached per model (its variables) and cluster in ``cache_dir``: a model measured before is
    not measured again. Under load from other programs the rows serve this call only, with a
    ``CalibrationWarning``, and are not cached.
    """
    from distlab.cluster.load import LoadMonitor, warn_disturbed
    from distlab.costmodel import CostModel

    res = cluster.resources
    base = cm if cm is not None else CostModel.default()
    targets = _model_cases([(model, data, loss)], batch_size)
    key = targets[0][0]
    if _measured(base, key, res):
        return base
    path = Path(cache_dir) / f"local-steps-{cache_key(res, None)}.json"
    cached = _read_rows(path)
    batches = set(targets[0][3])
    mine = [r for r in cached if r["key"] == key and int(r["batch"]) in batches]
    if mine and _measured(base.with_compute(mine), key, res):
        return base.with_compute(mine)
    worlds = range(1, res.world + 1)
    desc = f"measuring {model_name(model)}'s step on {res.world} ranks"
    bar = Progress(passes * len(worlds), desc, progress)
    cluster.settle()  # a fresh worker's warm-up import must not share the cores being measured
    monitor = LoadMonitor(cluster.client).start()
    try:
        bar.start("one step (for an estimate)")
        plan = plan_models(cluster, targets, worlds, passes, doing="measuring {names}'s step")
        rows = measure_models(cluster, targets, worlds, passes, bar=bar, plan=plan)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(INTERRUPTED.format(what=desc)) from None
    finally:
        bar.close()
    disturbed = warn_disturbed(
        f"measuring {model_name(model)}'s step",
        monitor.stop(),
        "its figures describe that load and are used for this prediction only, not cached; "
        "stop those programs for predictions of the quiet cluster",
    )
    if not disturbed:
        _write_rows(path, [r for r in cached if r["key"] != key] + [r.to_dict() for r in rows])
    return base.with_compute(rows)


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """The cached local steps (LocalStep dicts); an unreadable file or row is measured again."""
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    kept = []
    for r in rows if isinstance(rows, list) else []:
        try:
            kept.append(LocalStep.from_dict(r).to_dict())
        except (CalibrationError, TypeError, AttributeError):
            continue
    return kept


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    write_atomic(path, json.dumps(rows))


def _reference_worlds(res: Any) -> list[int]:
    """The training-loop stage's world sizes: 1, 2, one less than the whole cluster and the whole cluster.

    On several hosts, the same of the first host's ranks: the link between hosts is priced from its own
    measurements (the collectives across it, one flow and several sharing it: costmodel/links.py), not
    by moving the reference models' gradients over it again (at 200 Mbit/s that made this stage four
    minutes long). Two ranks at least: the loop's per-peer terms need a peer."""
    n = max(len(res.ranks_on(res.hosts[0])), min(2, res.world)) if res.num_hosts > 1 else res.world
    return sorted({1, min(2, n), max(1, n - 1), n})


def _cluster_seconds(res: Any, cached: Any) -> float:
    """What the cluster's own stages (collectives, profiles, the loop) add to an announced estimate:
    nothing when a ``cached`` calibration holds them."""
    return 0.0 if cached is not None else CLUSTER_SECONDS_PER_WORLD * len(_reference_worlds(res))


def _cluster_parts(res: Any, cases: Sequence[Any]) -> int:
    """The units of _calibrate_cluster's progress: the collectives' calls (one a repeat), each
    reference model's profile and at most one training-loop call per pass and world size."""
    return LINK_REPEATS + len(cases) + loop_parts(_reference_worlds(res))


def _measure_collectives(
    cluster: Cluster, res: ResourceSpec, sizes: Any, cases: Sequence[Any], bar: Progress
) -> Any:
    """The cluster's own figures: collectives, compute, the loop and the runtime's machinery."""
    import distlab as dl

    cm = measure_links(cluster, sizes, bar)
    tensors = measure_optimizer_tensors(cluster)  # about a second: no part of its own
    cm = cm.with_params(cm.params.with_(**fit_optimizer_tensors(tensors)), optimizer_tensor_rows=tensors)
    profiles = []
    for i, (m, _, b, _) in enumerate(cases):
        bar.start(f"profiling {type(m).__name__} ({i + 1} of {len(cases)} reference models)")
        profiles.append(dl.profile(_where_ranks_compute(m, res), batch_size=b))
        bar.done()
    # the reference models compute as measured beside the loop: what remains is the runtime's
    cm = measure_training_loop(cluster, cm, res, cases, profiles, _reference_worlds(res), bar=bar)
    reference = {model_key(p) for p in profiles}
    return cm.without_compute(reference)  # kept in the fingerprint: they describe no user's model


def _model_cases(models: Sequence[Any], batch_size: int) -> list[tuple[str, Any, Any, tuple[int, ...], Any]]:
    """(key, module, data, batches, loss) for each model to measure; a clear error for anything else."""
    from distlab.runs.validate import variables_profile

    check_positive("calibrate: batch_size", batch_size, CalibrationError)
    if models is None:
        models = ()
    if not isinstance(models, (list, tuple)):
        models = [models]
    batches = tuple(sorted({batch_size, max(1, batch_size // 4)}))
    out = []
    for i, item in enumerate(models):
        module, data, loss = (
            (*item, None)[:3] if isinstance(item, tuple) and 2 <= len(item) <= 3 else (item, None, None)
        )
        from distlab.keras_model import as_module, unwrap

        if data is None:
            data = keras_zoo_data(unwrap(module), max(256, 4 * max(batches)))
        module = as_module(module)  # a Keras 3 model: as the torch runtime runs it
        if not hasattr(module, "named_parameters"):
            raise CalibrationError(
                f"calibrate: models[{i}] is a {type(module).__name__}; give torch nn.Modules, or "
                "(module, dataset) or (module, dataset, loss) tuples"
            )
        if data is None:
            data = _synthetic_for(module, max(256, 4 * max(batches)), f"models[{i}]")
        out.append((model_key(variables_profile(module)), module, data, batches, loss))
    return out


def keras_zoo_data(model: Any, n: int) -> Any:
    """Synthetic data of a Keras zoo model, from its specs (None for another Keras model)."""
    from distlab.data import from_spec
    from distlab.zoo import keras_specs

    specs = keras_specs(model)
    return from_spec(specs[0], specs[1], n, seed=0) if specs is not None else None


def _synthetic_for(module: Any, n: int, where: str) -> Any:
    """Random data a model accepts: from its input/target specs (zoo models), else from the
    input its first layer fixes and the shape of its output (class indices over the last dim)."""
    import torch

    import distlab as dl
    from distlab.data import from_spec
    from distlab.profiling.torch_inputs import infer_input_spec, tensor_from_spec

    cls = type(module).__name__
    try:
        return dl.data.synthetic(module, n=n, seed=0)
    except Exception:  # noqa: BLE001 - no specs: infer them below
        pass
    try:
        spec = infer_input_spec(module)
        with torch.no_grad():
            was = module.training
            module.eval()
            try:
                out = module(tensor_from_spec(spec, 2, torch.Generator().manual_seed(0)))
            finally:
                module.train(was)
        target = {"shape": list(out.shape[1:-1]), "dtype": "int64", "high": int(out.shape[-1])}
        return from_spec(spec, target, n, seed=0)
    except Exception as exc:  # noqa: BLE001 - an input distlab cannot infer
        first = (str(exc).splitlines() or [""])[0][:200]
        raise CalibrationError(
            f"calibrate: {where} ({cls}): cannot make data it accepts ({first}); "
            f"pass ({cls.lower()}, dataset) or ({cls.lower()}, dataset, loss) with a few batches of your data"
        ) from None


def _measured(cm: CostModel, key: str, res: ResourceSpec) -> bool:
    """Whether ``cm`` has ``key``'s local step at every point a measurement of it files (one per
    world size; on several hosts, several world sizes share a point)."""
    have = set(cm.compute.measured(key))
    return all(local_point(res, k) in have for k in range(1, res.world + 1))


def _reference(layers: int, width: int = OVERHEAD_WIDTH) -> Any:
    import torch

    torch.manual_seed(0)
    blocks = [m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(width, 10))


def reference_cases() -> list[tuple[Any, Any, int, tuple[str, ...]]]:
    """(model, data, per-replica batch, builders) of the training-loop stage."""
    import torch

    import distlab as dl

    g = torch.Generator().manual_seed(0)
    mlp_data = torch.utils.data.TensorDataset(
        torch.randn(512, OVERHEAD_WIDTH, generator=g), torch.randint(0, 10, (512,), generator=g)
    )
    few, many = (_reference(n) for n in OVERHEAD_LAYERS)
    cases = [(few, mlp_data, OVERHEAD_BATCH, ("AllReduce",)), (many, mlp_data, OVERHEAD_BATCH, BUILDERS)]
    for width in WIDE_WIDTHS:
        wide_data = torch.utils.data.TensorDataset(
            torch.randn(256, width, generator=g), torch.randint(0, 10, (256,), generator=g)
        )
        cases.append((_reference(2, width), wide_data, OVERHEAD_BATCH, ("AllReduce", "PS", "Gossip")))
    for (name, opts, batch), builders in ((HEAVY, BUILDERS[:2]), (SPARSE, BUILDERS)):
        model = dl.zoo.get(name, **opts)
        cases.append((model, dl.data.synthetic(model, n=16 * batch, seed=0), batch, builders))
    overlap_data = torch.utils.data.TensorDataset(
        torch.randn(4 * OVERLAP_BATCH, OVERLAP_WIDTH, generator=g),
        torch.randint(0, 10, (4 * OVERLAP_BATCH,), generator=g),
    )
    overlap = _reference(OVERLAP_LAYERS, OVERLAP_WIDTH)
    cases.append((overlap, overlap_data, OVERLAP_BATCH, ("AllReduce",)))
    return cases


def _where_ranks_compute(model: Any, res: Any) -> Any:
    """``model`` itself, or a copy on this process's GPU when the Lab's ranks run on GPUs: the
    compute fit relates each reference's local step to its profile, so both are taken on the
    same kind of device (a GPU Lab's fit against CPU profiles would scale a user's GPU profile
    by the ratio of the two devices)."""
    import torch

    if res.gpus and torch.cuda.is_available():
        import copy

        return copy.deepcopy(model).cuda()
    return model
