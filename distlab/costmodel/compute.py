"""A model's own step measured on the cluster: compute with every rank busy at once, per world size.

``Lab.calibrate(models=[...])`` runs each model's local step (data, forward, loss, backward; no
gradient exchange, no optimizer; the ranks in lockstep, each step waiting for the slowest) on
every rank of a sub-cluster at once, at each world size and at two per-replica batch sizes
(``runtime.loopbench.loop_pass_rank``). The rows (``rows.LocalStep``, one per model, ranks
on the host, cores and batch) replace the profile's compute, scaled by the contention model,
wherever they apply: a model's step in a rank is slower than the profile measured it in the
notebook's process (thread pools, allocator, caches shared with the other ranks), and by how
much depends on the model. Between the batch sizes measured, compute is linear in the batch
(``a + s b`` per world size); a world size not measured is scaled from the nearest one measured
by the contention model.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distlab.costmodel.rows import LocalStep, as_rows
from distlab.errors import CalibrationError

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile


def model_key(profile: ModelProfile) -> str:
    """What identifies a model to the compute table: its trainable variables (name, shape, dtype, sparse)."""
    rows = sorted((v.name, list(v.shape), str(v.dtype), bool(v.sparse)) for v in profile.variables)
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


class ComputeTable:
    """Measured local steps, fitted to ``seconds = a + s * batch`` per (model, ranks on host, cores)."""

    def __init__(self, rows: Iterable[LocalStep | Mapping[str, Any]] = ()) -> None:
        self.rows = as_rows(LocalStep, rows)
        for i, r in enumerate(self.rows):
            if not float(r.seconds) > 0 or int(r.batch) < 1 or int(r.ranks) < 1:
                raise CalibrationError(
                    f"compute runs[{i}]: seconds, batch and ranks must be positive, got {r.to_dict()!r}"
                )
        points: dict[tuple[str, int, int | None], dict[int, list[float]]] = {}
        for r in self.rows:
            cores = int(r.cores) if r.cores else None
            points.setdefault((str(r.key), int(r.ranks), cores), {}).setdefault(int(r.batch), []).append(
                float(r.seconds)
            )
        self._lines: dict[tuple[str, int, int | None], tuple[float, float]] = {}
        for k, by_batch in points.items():
            b = np.array(sorted(by_batch), dtype=float)
            s = np.array([np.median(by_batch[int(x)]) for x in b])
            if len(b) >= 2:
                slope, icpt = np.polyfit(b, s, 1)
                if slope <= 0 or icpt < 0:  # noise at tiny steps: keep it monotone and non-negative
                    slope = max(float(slope), 0.0)
                    icpt = max(float(np.mean(s - slope * b)), 0.0)
            else:
                slope, icpt = s[0] / b[0], 0.0
            self._lines[k] = (float(icpt), float(slope))
        self.keys = {k[0] for k in self._lines}

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def measured(self, key: str) -> list[tuple[int, int | None]]:
        """(ranks on host, cores) measured for ``key``."""
        return sorted((n, c) for k, n, c in self._lines if k == key)

    def lookup(
        self,
        key: str,
        ranks: int,
        cores: int | None,
        batch: float,
        slowdown: Callable[[int, int | None], float],
    ) -> float | None:
        """Local step seconds of ``key`` at ``batch`` with ``ranks`` ranks sharing ``cores``; None if
        unmeasured.

        ``slowdown(n, c)`` is the contention model's slowdown, used to carry the nearest measured
        world size (same cores preferred, then the most ranks not above ``ranks``) to this one.
        """
        have = self.measured(key)
        if not have:
            return None
        same = [h for h in have if h[1] == cores] or have
        exact = [h for h in same if h[0] == ranks and h[1] == cores]
        ref = exact[0] if exact else max(same, key=lambda h: (h[0] <= ranks, -abs(h[0] - ranks)))
        icpt, slope = self._lines[(key, ref[0], ref[1])]
        seconds = icpt + slope * float(batch)
        if not exact:
            seconds *= slowdown(ranks, cores) / slowdown(ref[0], ref[1])
        return seconds

    def to_rows(self) -> list[dict[str, Any]]:
        """The rows in their stored form."""
        return [r.to_dict() for r in self.rows]


def compute_rows(
    keys: Sequence[str],
    batches: Sequence[int],
    per_rank: Sequence[Sequence[float]],
    ranks: int,
    cores: int | None,
) -> list[LocalStep]:
    """Table rows from seconds per rank per case (the slowest rank bounds a synchronous step; one
    list when the caller has already taken each step's slowest rank)."""
    return [
        LocalStep(
            key=key,
            ranks=int(ranks),
            cores=cores,
            batch=int(batch),
            seconds=float(max(r[i] for r in per_rank)),
        )
        for i, (key, batch) in enumerate(zip(keys, batches))
    ]
