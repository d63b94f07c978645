"""Lab.calibrate(): microbenchmarks and the training loop on the live cluster -> a fitted, cached CostModel.

The stages and what each fits are described in docs/cost-model.md.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from distlab.errors import CalibrationError, LaunchError
from distlab.runtime.microbench import microbench_worlds

CALIBRATION_BUDGET = 25.0  # seconds of microbenchmarks in all (the issue asks <= 60 s on the LocalCluster)
# the training-loop stage: two tiny MLPs (4 and 26 trainable tensors: what a step costs besides
# arithmetic), a small convnet (how a real model's compute slows with ranks sharing cores) and
# a small wide-and-deep model (sparse tables), under the runtime's main paths, at world sizes 1,
# 2 and the whole cluster
OVERHEAD_LAYERS = (1, 12)
OVERHEAD_WIDTH, OVERHEAD_BATCH, OVERHEAD_STEPS = 64, 8, 12
# the runtime's paths: buckets (and sparse all-gathers), server reduces, shards, gossip
BUILDERS = ("AllReduce", "PS", "PartitionedPS", "Gossip")
HEAVY = ("convnet", {"width": 16}, 16)  # zoo model, options, per-replica batch
SPARSE = ("wide_deep", {"rows": 2000}, 16)  # sparse tables: many small collective calls per step


def cache_key(resources: Any, sizes: Any) -> str:
    """Hosts, ranks, devices, cores, the sizes asked and library versions: what a calibration depends on."""
    versions = {}
    for lib in ("distlab", "torch", "numpy", "distributed"):
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    fp = {
        "ranks": [[r.host, r.device] for r in resources.ranks],
        "cores": dict(sorted(resources.cores.items())),
        "sizes": list(sizes) if sizes else None,
        "versions": versions,
    }
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def calibrate_lab(lab: Any, sizes: Any = None, cache: bool = True, progress: bool = True) -> Any:
    """Run the microbenchmarks on ``lab`` (or read the cached result) and fit a CostModel."""
    try:
        from distlab.costmodel import CostModel
        from distlab.runtime import microbench  # noqa: F401
    except ImportError as exc:
        raise CalibrationError(
            f"calibration needs distlab.costmodel and distlab.runtime.microbench ({exc})"
        ) from None
    res = lab.resources
    if res.world < 2:
        raise CalibrationError(
            f"calibrate: the Lab has {res.world} worker; collectives need 2 or more (Lab(workers=2))"
        )
    path = Path(lab.cache_dir) / f"calibration-{cache_key(res, sizes)}.json"
    if cache and path.exists():
        try:
            return CostModel.load(path)
        except CalibrationError:
            pass  # a broken cache file is measured again and overwritten
    worlds = list(range(2, res.world + 1))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=3, desc=f"calibrating {res.world} ranks", unit="stage", leave=False)
    try:
        try:
            out = lab.run_ranks(
                microbench_worlds,
                list(sizes) if sizes else None,
                worlds,
                CALIBRATION_BUDGET,
                lab.timeout,
                timeout=CALIBRATION_BUDGET + 2 * lab.timeout,
            )
        except LaunchError as exc:
            raise CalibrationError(f"calibrate: microbenchmarks failed: {exc}") from None
        if bar is not None:
            bar.update(1)
        rows = out[0]
        cm = CostModel.from_microbenchmarks(rows, res)
        if bar is not None:
            bar.update(1)
        cm = cm.with_overhead(measure_overhead(lab, cm, res))
        if bar is not None:
            bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        cm.save(path)
    return cm


def _reference(layers: int) -> Any:
    import torch

    torch.manual_seed(0)
    blocks = [m for _ in range(layers) for m in (torch.nn.Linear(OVERHEAD_WIDTH, OVERHEAD_WIDTH), torch.nn.ReLU())]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(OVERHEAD_WIDTH, 10))


def _reference_cases() -> list[tuple[Any, Any, int, tuple[str, ...]]]:
    """(model, data, per-replica batch, builders) of the training-loop stage."""
    import torch

    import distlab as dl

    g = torch.Generator().manual_seed(0)
    mlp_data = torch.utils.data.TensorDataset(
        torch.randn(512, OVERHEAD_WIDTH, generator=g), torch.randint(0, 10, (512,), generator=g)
    )
    few, many = (_reference(n) for n in OVERHEAD_LAYERS)
    cases = [(few, mlp_data, OVERHEAD_BATCH, ("AllReduce",)), (many, mlp_data, OVERHEAD_BATCH, BUILDERS)]
    for (name, opts, batch), builders in ((HEAVY, BUILDERS[:2]), (SPARSE, BUILDERS)):
        model = dl.zoo.get(name, **opts)
        cases.append((model, dl.data.synthetic(model, n=16 * batch, seed=0), batch, builders))
    return cases


def measure_overhead(lab: Any, cm: Any, res: Any) -> list[dict[str, Any]]:
    """The real training loop on the reference models and builders at world sizes 1, 2 and N: measured
    in-step seconds against what ``cm`` (microbenchmarks only) predicts for the same runs."""
    import distlab as dl
    from distlab.launch.cluster import sub_resources
    from distlab.runtime.microbench import overhead_rank

    cases = _reference_cases()
    profiles = [dl.profile(m, batch_size=b) for m, _, b, _ in cases]
    rows = []
    for k in sorted({1, min(2, res.world), res.world}):
        sub = sub_resources(res, list(res.addresses)[:k])
        plans = [
            (p, dl.strategy.build(builder, p, sub, batch_size=b), (m, data, b))
            for p, (m, data, b, builders) in zip(profiles, cases)
            for builder in builders
            if builder != "Gossip" or k > 1  # gossip needs a neighbour
        ]
        jobs = [(m, s, data, b) for _, s, (m, data, b) in plans]
        try:
            per_rank = lab.run_ranks(overhead_rank, jobs, OVERHEAD_STEPS, lab.timeout, world=k)
        except LaunchError as exc:
            raise CalibrationError(f"calibrate: the training-loop stage failed at world {k}: {exc}") from None
        host = sub.ranks[0].host
        for i, (p, s, _) in enumerate(plans):
            pred, c = cm.predict(p, sub, s), cm.compile(p, s)
            rows.append(
                {
                    "world": k,
                    "builder": s.builder,
                    "tensors": len(p.variables),
                    "calls": c.n_calls,
                    "gather_calls": c.ag_calls + c.sps_gather_calls + c.sps_bcast_calls,
                    "gossip_bytes": c.gossip_bytes * c.gossip_degree,
                    "measured": max(r[i] for r in per_rank),
                    "predicted": pred.step_time,
                    "compute": pred.breakdown["compute"],
                    "ranks_on_host": len(sub.ranks_on(host)),
                    "cores": sub.cores.get(host),
                }
            )
    return rows
