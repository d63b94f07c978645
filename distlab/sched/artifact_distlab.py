"""The Pollux artifact's jobs seeing distlab's step model instead of Pollux's (issue 58's "beyond Pollux").

A ``DistlabJob`` is the artifact's job (true progress from the traces, the same gradient
statistics and batch search) whose throughput model, once it has measured two local batches and
three placements-and-batches, is distlab's structural step model (``costmodel.fit``) fitted to
its own steps; before that it is Pollux's, as the artifact's job. The policy then sees that
job's speedups, and the job picks its batch and accumulation with it.

The artifact measured one strategy per model (data-parallel all-reduce), so the strategy
re-choice of ``sched.speedup`` has one candidate here; its restart is the artifact's 30 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from distlab.sched.artifact import ArtifactJob
from distlab.sched.artifact_goodput import GoodputFunction


class DistlabGoodputFunction(GoodputFunction):
    """The artifact's goodput (throughput x statistical efficiency) with distlab's fitted step model."""

    def __init__(self, theta: dict[str, float], grad_params: Any, init_batch_size: int) -> None:
        super().__init__((0.0,) * 7, grad_params, init_batch_size)
        self.theta = theta

    def throughput(self, num_nodes: Any, num_replicas: Any, atomic_bsz: Any, accum_steps: Any) -> Any:
        from distlab.costmodel.fit import step_time

        n, r, b, a = np.broadcast_arrays(
            *(np.asarray(x, dtype=float) for x in (num_nodes, num_replicas, atomic_bsz, accum_steps))
        )
        # the artifact counts extra micro-batches (accum_steps + 1 in all); distlab counts them all
        cols = {
            "num_nodes": n,
            "num_replicas": r,
            "local_bsz": b,
            "accum_steps": a + 1,
            "grad_bytes": np.ones_like(n),
        }
        return r * b * (a + 1) / step_time(self.theta, cols)


@dataclass
class DistlabJob(ArtifactJob):
    """An artifact job whose throughput model is distlab's step model once its steps identify it."""

    theta: dict[str, float] | None = None

    def goodput_fn(self) -> GoodputFunction:
        if self.theta is None:
            return super().goodput_fn()
        return DistlabGoodputFunction(self.theta, self.grad_params, self.app.init_batch_size)

    def _observe(self, nodes: int, replicas: int, step: float, sync: float, sqr: float, var: float) -> None:
        seen = len(self.profile)
        super()._observe(nodes, replicas, step, sync, sqr, var)
        if self.fixed_replicas is not None or len(self.profile) == seen:
            return
        rows = np.array([[*k, v[0]] for k, v in self.profile.items()], dtype=float)
        # two local batches at least: with one, compute's constant and per-sample parts are not
        # identifiable and the batch search would take the largest batch as free
        if len(rows) < 3 or len(np.unique(rows[:, 2])) < 2:
            return
        import pandas as pd

        from distlab.costmodel.fit import fit_measurements

        df = pd.DataFrame(rows, columns=["num_nodes", "num_replicas", "local_bsz", "step_time"])
        _, self.theta, _ = fit_measurements(df)
