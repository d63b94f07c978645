"""A straggler and jitter asked for (``RunOptions.slowdown``, ``RunOptions.jitter``): the waits a
rank adds before each backward, and the forward and backward seconds each step records."""

from __future__ import annotations

import random
import time
from typing import Any


class Straggler:
    """A rank slowed by ``factor`` (``RunOptions.slowdown``) and varied by ``jitter``
    (``RunOptions.jitter``): before each backward it waits ``factor - 1 + jitter * E`` (E an
    exponential draw of mean 1) times this forward and the last backward, as a device that much
    slower would take; gradients become ready that much later, so its collectives start late as
    a real straggler's do. A factor of 1 and no jitter wait for nothing."""

    def __init__(self, factor: float, recorded: bool = False, jitter: float = 0.0, seed: int = 0) -> None:
        """``recorded``: some rank of the run is slowed, so every rank's records say how long it
        waited; ``seed``: the jitter's generator (the run's seed and this rank)."""
        self.factor, self.recorded, self.jitter = float(factor), recorded, float(jitter)
        self.last_backward, self.waited, self.compute = 0.0, 0.0, 0.0
        self._rng = random.Random(seed)

    def wait(self, forward: float, tracer: Any) -> None:
        self.compute += forward
        extra = self.factor - 1.0 + (self.jitter * self._rng.expovariate(1.0) if self.jitter else 0.0)
        if extra <= 0.0:
            return
        seconds = extra * (forward + self.last_backward)
        with tracer.span("slowdown (a straggler asked for)", "slowdown", factor=1.0 + extra):
            time.sleep(seconds)
        self.waited += seconds

    @classmethod
    def for_job(cls, job: Any) -> Straggler:
        """This rank's straggler from its ``RankJob``: its factor, the run's jitter, seeded by rank."""
        o = job.options
        slowed = dict(o.slowdown).get(job.rank, 1.0)
        return cls(slowed, bool(o.slowdown or o.jitter), o.jitter, job.seed * 1000 + job.rank)

    def backward_took(self, seconds: float) -> None:
        self.last_backward = seconds
        self.compute += seconds

    def record(self) -> dict[str, float]:
        """The step's ``compute`` (seconds of forward and backward, every micro-batch, the wait
        excluded) and, when recorded, its ``delay`` (seconds waited), both since the last call."""
        out = {"compute": self.compute, **({"delay": self.waited} if self.recorded else {})}
        self.waited = self.compute = 0.0
        return out
