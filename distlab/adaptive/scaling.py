"""Learning-rate scaling for a global batch larger than the one the learning rate was set for.

``scale`` S is the global batch of one optimizer step over the base batch (the batch the
optimizer's learning rate was chosen for: the strategy's per-replica batch, what one process
trains at). The rules:

- ``none``: the rate as given;
- ``linear``: S x rate (Goyal et al. 2017);
- ``sqrt``: sqrt(S) x rate (Krizhevsky 2014; the usual rule for Adam);
- ``adascale``: AdaScale's gain r = (sigma^2 + mu^2) / (sigma^2 / S + mu^2) per parameter group,
  from the gradient noise measured live (Johnson et al. 2020), sqrt(r) for Adam-like optimizers
  (AdaptDL's form).

The gain is applied around the optimizer's step only: between steps the groups hold the base
rate, so a learning-rate scheduler the user steps sees (and sets) the rate it was written for.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from distlab.errors import LaunchError
from distlab.strategy.types import LR_SCALING as RULES

# the rules the runtime executes (all of them: adascale with the noise scale measured live);
# launch refuses any other in one line
RUN = ("none", "linear", "sqrt", "adascale")


def check_rule(rule: str, where: str = "batch.lr_scaling") -> str:
    """``rule`` if the runtime runs it, else one LaunchError naming the field and the rules that run."""
    if rule not in RULES:
        raise LaunchError(f"{where}: {rule!r} is not a scaling rule; use one of: {', '.join(RULES)}")
    if rule not in RUN:
        raise LaunchError(
            f"{where}: {rule!r} is not run by distlab's runtime yet; use one of: {', '.join(RUN)}"
        )
    return rule


def fixed_gain(rule: str, scale: float) -> float:
    """The gain of a rule that depends on the scale alone (``none``, ``linear``, ``sqrt``)."""
    if not scale > 0:
        raise LaunchError(f"lr scaling: the scale (global batch / base batch) must be > 0, got {scale!r}")
    if rule == "none":
        return 1.0
    if rule == "linear":
        return float(scale)
    if rule == "sqrt":
        return math.sqrt(scale)
    raise LaunchError(f"lr scaling: {rule!r} has no fixed gain; it needs the gradient's noise (adascale)")


def is_adam_like(optimizer: Any) -> bool:
    """Adam, AdamW and their kin (a ``betas`` entry in every group): adaptive preconditioning."""
    groups = getattr(optimizer, "param_groups", None) or []
    return bool(groups) and all("betas" in g for g in groups)


def check_optimizer(optimizer: Any, rule: str) -> None:
    """A scaling rule needs a numeric ``lr`` in each of the optimizer's parameter groups."""
    if rule == "none" or optimizer is None:
        return
    for i, g in enumerate(getattr(optimizer, "param_groups", None) or [{}]):
        lr = g.get("lr")
        if isinstance(lr, bool) or not isinstance(lr, (int, float)):
            raise LaunchError(
                f"batch.lr_scaling {rule!r}: the optimizer {type(optimizer).__name__} has no numeric 'lr' in "
                f"parameter group {i} (got {lr!r}), so its rate cannot be scaled; use lr_scaling='none'"
            )


@contextmanager
def scaled(optimizers: Sequence[Any], gains: Sequence[float] | float) -> Iterator[None]:
    """Within the block, each parameter group's ``lr`` is multiplied by its gain (one gain per
    group of each optimizer in turn, or one for all); the base rates are put back after it."""
    opts = [o for o in optimizers if o is not None]
    groups = [g for o in opts for g in o.param_groups]
    per = [float(gains)] * len(groups) if isinstance(gains, (int, float)) else [float(x) for x in gains]
    if len(per) != len(groups):
        raise LaunchError(f"lr scaling: {len(per)} gains for {len(groups)} parameter groups")
    if all(x == 1.0 for x in per):
        yield
        return
    base = [g["lr"] for g in groups]
    for g, x in zip(groups, per, strict=True):
        g["lr"] = g["lr"] * x
    try:
        yield
    finally:
        for g, lr in zip(groups, base, strict=True):
            g["lr"] = lr
