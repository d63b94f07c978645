"""The gradient noise scale measured live in a run (AdaptDL's GradientNoiseScale, on distlab's kernels).

Per optimizer step, per parameter group (as the run's optimizer factory groups the variables):

- each rank's local gradient (its ``batch * accumulation`` samples) has its squared norm taken in
  the gradient hooks, before any averaging touches it;
- after the sync, the averaged gradient's squared norm is taken once per variable (replicated
  variables on rank 0, a parameter server's variables on their server);
- one all-reduce of those few floats per step sums them; the local norms' mean and the global norm
  are two batch sizes of the same gradient, which is all ``adaptive.noise`` needs.

On one rank: with accumulation, the micro-batches' own gradients (tensor hooks, before they are
added up) against their sum; without, two consecutive steps' gradients against their mean (the
differenced estimator: it keeps a copy of the previous step's gradient).

Adam-like optimizers (a ``betas`` entry in every group): norms are taken of the gradient
weighted by the preconditioner the optimizer applies (P = 1 / (sqrt(v / (1 - beta2^t)) + eps):
norms g^T P g, AdaptDL's form), which needs the optimizer's state on the rank taking the norm; so with them,
variables on
parameter servers are left out of the estimate. Gossip variables are always left out: their
gradient is never averaged, so no global norm exists.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distlab.adaptive.goodput import adascale_gain
from distlab.adaptive.noise import SMOOTHING, NoiseScale
from distlab.adaptive.scaling import is_adam_like
from distlab.runtime.plan import SyncUnit


def _sq(g: torch.Tensor, weight: torch.Tensor | None = None) -> float:
    """Squared norm of a gradient (a sparse one by its summed rows), optionally weighted elementwise."""
    if g.is_sparse:
        g = g.coalesce().to_dense() if weight is not None else g.coalesce().values()
    g = g.detach().float()
    return float((g * g * weight).sum() if weight is not None else (g * g).sum())


class GradNoise:
    """Measures the noise scale of a run's gradients; ``gains`` gives AdaScale's learning-rate gains."""

    def __init__(
        self,
        units: Sequence[SyncUnit],
        make_optimizer: Callable[[list], Any],
        rank: int,
        world: int,
        batch: int,
        accumulation: int,
        wait: Callable[[Any], None],
        smoothing: float = SMOOTHING,
    ) -> None:
        self.rank, self.world, self.batch, self.accum, self.wait = rank, world, batch, accumulation, wait
        # the factory's grouping over every variable, the same on every rank (an optimizer without
        # state: built only to read its groups)
        reference = make_optimizer([u.target for u in units])
        self.adam = is_adam_like(reference)
        self.group_of = {id(p): gi for gi, g in enumerate(reference.param_groups) for p in g["params"]}
        del reference
        self.groups = max(self.group_of.values(), default=0) + 1
        self.units = [u for u in units if u.sync.kind != "gossip" and not (self.adam and u.sync.kind == "ps")]
        self.units_of: dict[int, list[SyncUnit]] = {}
        for u in self.units:
            self.units_of.setdefault(id(u.param), []).append(u)
        self.estimate = NoiseScale(self.groups, smoothing)
        self.scale = 1.0  # the step's global batch over the base batch (set by the batch state)
        self.optimizers: list[Any] = []
        self._local = np.zeros(self.groups)
        self._micro = np.zeros(self.groups)
        self._prev: dict[int, torch.Tensor] | None = None
        self._hooks: list[Any] = []
        if world == 1:  # each micro-batch's own gradient, before accumulation (when there are several)
            for p in {id(u.param): u.param for u in self.units}.values():
                self._hooks.append(p.register_hook(self._micro_hook(p)))

    # -- what the runtime calls -------------------------------------------------------------------
    def use_optimizers(self, *optimizers: Any) -> None:
        """The run's optimizers (their state is Adam's preconditioner)."""
        self.optimizers = [o for o in optimizers if o is not None]

    def begin_step(self) -> None:
        self._local[:] = 0.0
        self._micro[:] = 0.0

    def on_local_grad(self, p: torch.Tensor) -> None:
        """A variable's accumulated local gradient, before the sync averages it (the last micro-batch)."""
        for u in self.units_of.get(id(p), ()):
            self._local[self.group_of[id(u.target)]] += _sq(u.view(p.grad), self._weight(u))

    def after_sync(self) -> None:
        """Every averaged gradient is in place: take its norm, sum the few floats over ranks, update."""
        glob = np.zeros(self.groups)
        for u in self.units:
            owner = u.sync.server if u.sync.kind == "ps" else 0
            if self.rank == owner and u.target.grad is not None:
                glob[self.group_of[id(u.target)]] += _sq(u.target.grad, self._weight(u))
        b, k, n = self.batch, self.accum, self.world
        if n > 1:
            buf = torch.from_numpy(np.concatenate([self._local, glob]))
            self.wait(dist.all_reduce(buf, async_op=True))
            local_mean, glob = buf[: self.groups].numpy() / n, buf[self.groups :].numpy()
            self.estimate.update(b * k, local_mean, b * k * n, glob, self.scale)
        elif k > 1:
            self.estimate.update(b, self._micro / k, b * k, glob, self.scale)
        else:
            self._differenced(glob)

    def gains(self, scale: float, base_batch: int) -> list[float]:
        """AdaScale's gain per group of each optimizer (in ``use_optimizers`` order) for a global
        batch ``scale`` times ``base_batch``: r, or sqrt(r) for Adam-like optimizers; 1 before the
        first estimate."""
        per_group = []
        for gi in range(self.groups):
            stats = self.estimate.stats(gi)
            r = 1.0 if stats is None or scale <= 1 else adascale_gain(stats, scale, base_batch)
            per_group.append(r**0.5 if self.adam else r)
        out = []
        for opt in self.optimizers:
            for g in opt.param_groups:
                first = g["params"][0] if g["params"] else None
                out.append(per_group[self.group_of.get(id(first), 0)] if first is not None else 1.0)
        return out

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # -- internals --------------------------------------------------------------------------------
    def _micro_hook(self, p: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def hook(g: torch.Tensor) -> None:
            if self.accum < 2:
                return
            for u in self.units_of.get(id(p), ()):
                # the micro-batch's loss was divided by the number of micro-batches: undo it
                self._micro[self.group_of[id(u.target)]] += _sq(u.view(g) * self.accum, self._weight(u))

        return hook

    def _weight(self, u: SyncUnit) -> torch.Tensor | None:
        """Adam's preconditioner for this unit (None: plain norms, or no second moment yet)."""
        if not self.adam:
            return None
        for opt in self.optimizers:
            state = opt.state.get(u.target)
            if state and "exp_avg_sq" in state:
                group = next(g for g in opt.param_groups if any(p is u.target for p in g["params"]))
                beta2, eps = group["betas"][1], group["eps"]
                step = float(state["step"])
                v = state["exp_avg_sq"] / (1 - beta2**step)
                return 1.0 / (v.sqrt() + eps)
        return None

    def _differenced(self, glob: np.ndarray) -> None:
        """One rank, one micro-batch: this step's gradient and the previous one are two batches of b."""
        now = {
            id(u): (u.target.grad.coalesce().to_dense() if u.target.grad.is_sparse else u.target.grad)
            .detach()
            .clone()
            for u in self.units
            if u.target.grad is not None
        }
        prev, self._prev = self._prev, now
        if prev is None:
            return
        pair = np.zeros(self.groups)
        both = np.zeros(self.groups)
        for u in self.units:
            a, b = now.get(id(u)), prev.get(id(u))
            if a is None or b is None:
                continue
            gi, w = self.group_of[id(u.target)], self._weight(u)
            pair[gi] += _sq(a, w) + _sq(b, w)
            both[gi] += _sq((a + b) / 2, w)
        self.estimate.update(self.batch, pair / 2, 2 * self.batch, both, self.scale)
