"""One rank's batch settings while it trains: batch, accumulation, learning-rate gain, the noise
scale, and (for adaptive runs) the goodput controller's decisions at epoch boundaries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from distlab.adaptive import scaling
from distlab.adaptive.controller import GoodputController
from distlab.adaptive.goodput import statistical_efficiency
from distlab.adaptive.noise import NoiseScale
from distlab.runtime.data import RankBatches


class BatchState:
    """What one optimizer step reads and how its rate is scaled; identical on every rank.

    ``base`` is the batch the optimizer's learning rate is set for (the starting per-replica
    batch unless ``RankJob.options.base_batch``); the scale of a step is its global batch over it.
    ``controller`` (adaptive runs): a ``GoodputController`` consulted when a step crosses an
    epoch boundary of ``data``; rank 0 decides, every rank applies the same decision.
    """

    def __init__(
        self,
        job: Any,
        noise: Any,
        optimizers: list[Any],
        wait: Callable[[Any], None],
        controller: GoodputController | None = None,
        collate: Any = None,
    ) -> None:
        """``collate``: an own loop's ``collate_fn`` (runtime/data.py ``RankBatches``)."""
        self.job, self.noise, self.optimizers, self.wait = job, noise, optimizers, wait
        self.collate = collate
        self.rule = scaling.check_rule(job.strategy.batch.lr_scaling)
        for opt in optimizers:
            scaling.check_optimizer(opt, self.rule)
        batch = job.batch_size or job.strategy.batch.per_replica
        self.base = int(job.options.base_batch or batch)
        self.controller = controller
        self.progress = float(job.options.progress)
        self.configure(batch, job.strategy.batch.accumulation)
        if noise is not None:
            noise.use_optimizers(*optimizers)

    def configure(self, batch: int, accumulation: int) -> None:
        j = self.job
        self.batch, self.accum = int(batch), int(accumulation)
        self.data = RankBatches(
            j.data, self.batch, j.rank, j.world, j.shuffle, j.seed, self.accum, self.collate
        )
        self.global_batch = self.data.global_batch
        self.scale = self.global_batch / self.base
        if self.noise is not None:
            self.noise.batch, self.noise.accum, self.noise.scale = self.batch, self.accum, self.scale

    def gains(self) -> Any:
        """The learning-rate gain (one, or one per parameter group) for this step."""
        if self.rule == "adascale":
            return self.noise.gains(self.scale, self.base)
        return scaling.fixed_gain(self.rule, self.scale)

    def scaled(self, gains: Any) -> Any:
        return scaling.scaled(self.optimizers, gains)

    def after_step(self, pos_before: int, pos: int, seconds: float, gains: Any) -> dict[str, Any]:
        """The step's adaptive columns (empty when the noise is not measured); at an epoch
        boundary, the controller's decision applied for the next step."""
        cols: dict[str, Any] = {}
        if self.noise is not None:
            cols = self.columns(gains, seconds)
            self.progress = cols["progress"]
        if self.controller is not None:
            self.controller.observe((self.batch, self.accum), seconds)
            n = len(self.data.data)
            if pos_before // n != pos // n:
                self._decide()
        return cols

    def columns(self, gains: Any, seconds: float) -> dict[str, Any]:
        """Noise scale phi (samples), the global batch's statistical efficiency against the base
        (Pollux: (phi + M0) / (phi + M)), the mean learning-rate gain, progress in scale-invariant
        samples (each step adds M x efficiency: the base batch's samples for the same progress)
        and the step's goodput (samples/s x efficiency)."""
        phi = self.noise.estimate.noise_scale
        m = self.global_batch
        eff = 1.0 if phi is None else float(statistical_efficiency(m, phi, self.base))
        g = [gains] if isinstance(gains, (int, float)) else list(gains) or [1.0]
        return {
            "per_replica": self.batch,
            "global_batch": m,
            "accumulation": self.accum,
            "noise_scale": float("nan") if phi is None else float(phi),
            "efficiency": eff,
            "lr_gain": float(sum(g) / len(g)),
            "progress": self.progress + m * eff,
            "goodput": m * eff / seconds if seconds > 0 else float("nan"),
        }

    def _decide(self) -> None:
        est = self.noise.estimate
        current = (self.batch, self.accum)
        choice = torch.tensor(
            self.controller.decide(current, est.noise_scale, est.updates) if self.job.rank == 0 else current
        )
        if self.job.world > 1:
            self.wait(dist.broadcast(choice, src=0, async_op=True))
        new = (int(choice[0]), int(choice[1]))
        if new != current:
            self.configure(*new)

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "batch": self.batch,
            "accumulation": self.accum,
            "progress": self.progress,
            "world": self.job.world,
        }
        if self.noise is not None:
            out["noise"] = self.noise.estimate.to_dict()
        if self.controller is not None:
            out["measured"] = {f"{b},{k}": v for (b, k), v in self.controller.measured.items()}
        return out

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """Restore progress and the noise estimate; the batch only when the world is unchanged (a
        resize re-optimises it: the controller decides at the next epoch boundary)."""
        if not state:
            return
        self.progress = float(state.get("progress", self.progress))
        if self.noise is not None and state.get("noise"):
            saved = NoiseScale.from_dict(state["noise"])
            if saved.groups == self.noise.estimate.groups:
                self.noise.estimate = saved
        same_world = state.get("world") == self.job.world
        if self.controller is not None and same_world:
            for key, v in (state.get("measured") or {}).items():
                b, k = (int(x) for x in key.split(","))
                self.controller.measured[(b, k)] = list(v)
        if self.controller is not None:
            if same_world and "batch" in state:
                self.configure(int(state["batch"]), int(state["accumulation"]))
            else:  # a resize: the batch re-optimised for the new world at once
                self._decide()
