"""Lab.calibrate(): microbenchmarks on every rank of the live cluster -> a fitted, cached CostModel."""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

from distlab.errors import CalibrationError, LaunchError
from distlab.runtime.microbench import microbench_worlds

CALIBRATION_BUDGET = 40.0  # seconds of microbenchmarks in all (the issue asks <= 60 s on the LocalCluster)


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

        bar = tqdm(total=2, desc=f"calibrating {res.world} ranks", unit="stage", leave=False)
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
    finally:
        if bar is not None:
            bar.close()
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        cm.save(path)
    return cm
