"""The shared-cluster benchmark's programs: three runs of different models launched back to back on one
shared Lab, under one policy, timed from the first launch to the last run's end.

Each run asks for 1..2 workers (``min_workers=1, max_workers=2``); what a round records per run is
its job completion time, its restarts, whether each step ran once (rank 0's steps 0..n-1, none
re-run or skipped across a re-allocation) and whether every step moved the data position by its own
global batch from 0 (so each sample of an epoch is seen once, at every world size it trained at).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch


class Blobs(torch.utils.data.Dataset):
    """A learnable classification set: class k is a Gaussian blob around centre k."""

    def __init__(self, n: int, d: int, classes: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.x = (torch.randn(classes, d, generator=g) * 3)[self.y] + torch.randn(n, d, generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


@dataclass(frozen=True)
class Job:
    """One of the three runs: an MLP ``d -> width x depth -> 4`` trained ``steps`` steps at ``batch``."""

    name: str
    d: int
    width: int
    depth: int
    steps: int
    batch: int = 32

    def model(self) -> torch.nn.Module:
        layers: list[torch.nn.Module] = []
        size = self.d
        for _ in range(self.depth):
            layers += [torch.nn.Linear(size, self.width), torch.nn.ReLU()]
            size = self.width
        return torch.nn.Sequential(*layers, torch.nn.Linear(size, 4))

    def data(self, seed: int) -> Blobs:
        return Blobs(n=self.batch * 40, d=self.d, seed=seed)


def data_once(run: Any) -> dict[str, bool]:
    """Rank 0's steps each once, and the data position advanced by each step's global batch from 0."""
    m = run.metrics
    r0 = m[m["rank"] == 0].sort_values("step")
    steps_once = list(r0["step"]) == list(range(len(r0))) and len(r0) == run.steps
    batch = run.batch_size
    positions = (r0["samples"].to_numpy() == (r0["world"].to_numpy() * batch).cumsum()).all()
    return {"steps_once": bool(steps_once), "samples_once_per_epoch": bool(positions)}


def resize_gaps(run: Any) -> list[float]:
    """Seconds between rank 0's last step before each restart and its first step after it."""
    m = run.metrics
    r0 = m[m["rank"] == 0].sort_values("step")
    gaps = []
    for k in sorted(set(r0["restart"]))[1:]:
        before, after = r0[r0["restart"] == k - 1], r0[r0["restart"] == k]
        if len(before) and len(after):
            gaps.append(float(after["wall_time"].iloc[0] - before["wall_time"].iloc[-1]))
    return gaps


def three_runs(lab: Any, policy: Any, jobs: list[Job], seed: int = 0, timeout: float = 600) -> dict[str, Any]:
    """Launch ``jobs`` back to back on ``lab`` under ``policy``; wait for all; what the round measured."""
    lab.scheduler.policy = policy
    before = lab.scheduler.reallocations
    start = time.perf_counter()
    runs = []
    for i, job in enumerate(jobs):
        torch.manual_seed(seed + i)
        runs.append(
            lab.launch(
                job.model(),
                steps=job.steps,
                data=job.data(seed + i),
                batch_size=job.batch,
                optimizer="sgd",
                lr=0.05,
                min_workers=1,
                max_workers=2,
            )
        )
    for run in runs:
        run.wait(timeout=timeout, progress=False)
    makespan = time.perf_counter() - start
    lab.scheduler.step()  # the round that notes the last end (its jct) now, not at the next interval
    frame = lab.queue.frame().set_index("run")
    per_run = []
    for job, run in zip(jobs, runs):
        losses = run.losses
        per_run.append(
            {
                "job": job.name,
                "run": run.id,
                "jct_s": float(frame.loc[run.id, "jct_s"]),
                "waited_s": float(frame.loc[run.id, "waited_s"]),
                "restarts": run.restarts,
                "worlds": sorted(set(int(w) for w in run.metrics["world"])),
                "loss_first3": float(losses.iloc[:3].mean()),
                "loss_last3": float(losses.iloc[-3:].mean()),
                "resize_gaps_s": resize_gaps(run),
                **data_once(run),
            }
        )
    return {
        "makespan_s": makespan,
        "mean_jct_s": sum(r["jct_s"] for r in per_run) / len(per_run),
        "reallocations": lab.scheduler.reallocations - before,
        "runs": per_run,
    }
