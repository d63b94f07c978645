"""The goodput controller (Pollux/AdaptDL): the global batch, and its split into per-replica batch
and accumulation, that maximise goodput within the user's bounds.

goodput(M) = throughput(M) x efficiency(M), efficiency = (phi + M0) / (phi + M). Throughput comes
from distlab's cost model: the launcher predicts the step time of every allowed (per-replica
batch, accumulation) for the run's strategy and cluster (``step_table``), and the controller
refits that table online from the run's own step times (a configuration it has run is priced by
its measured median; the others by their prediction times the measured-over-predicted ratio of
the configurations run). Decisions are taken only at epoch boundaries, and only when the best
configuration's goodput beats the current one's by ``hysteresis`` (AdaptDL issue 27: batch sizes
thrashing between near-equal choices).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from distlab.adaptive.goodput import statistical_efficiency
from distlab.errors import StrategyError

HYSTERESIS = 0.05  # a new configuration must promise this much more goodput
MIN_UPDATES = 20  # noise-scale updates before the first decision (its average is noise before)
KEEP = 20  # step times kept per configuration for its median


@dataclass
class GoodputController:
    """Chooses (per-replica batch, accumulation) for ``world`` ranks from ``step_table`` (predicted
    seconds per optimizer step of each allowed configuration) and the noise scale."""

    step_table: Mapping[tuple[int, int], float]
    world: int
    base_batch: int
    hysteresis: float = HYSTERESIS
    measured: dict[tuple[int, int], list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.step_table:
            raise StrategyError("GoodputController: no configuration within the bounds")
        self.step_table = {_pair(k): float(v) for k, v in dict(self.step_table).items()}

    def observe(self, config: tuple[int, int], seconds: float) -> None:
        """One optimizer step of ``config`` took ``seconds`` (the slowest rank's)."""
        times = self.measured.setdefault(_pair(config), [])
        times.append(float(seconds))
        del times[:-KEEP]

    def step_time(self, config: tuple[int, int]) -> float:
        """Seconds per step of ``config``: measured where run, else predicted x the runs' ratio."""
        config = _pair(config)
        if len(self.measured.get(config, ())) >= 3:
            return statistics.median(self.measured[config])
        ratios = [
            statistics.median(v) / self.step_table[c]
            for c, v in self.measured.items()
            if len(v) >= 3 and self.step_table.get(c, 0) > 0
        ]
        ratio = statistics.median(ratios) if ratios else 1.0
        return self.step_table[config] * ratio

    def goodput(self, config: tuple[int, int], noise_scale: float) -> float:
        b, k = config
        m = b * k * self.world
        return m / self.step_time(config) * float(statistical_efficiency(m, noise_scale, self.base_batch))

    def best(self, noise_scale: float) -> tuple[int, int]:
        """The configuration of highest goodput at ``noise_scale`` (ties: less accumulation, then
        the larger per-replica batch), with no hysteresis."""
        return max(self.step_table, key=lambda c: (self.goodput(c, noise_scale), -c[1], c[0]))

    def decide(self, current: tuple[int, int], noise_scale: float | None, updates: int) -> tuple[int, int]:
        """The configuration for the next epoch: the best by goodput if it beats ``current`` by the
        hysteresis margin, else ``current`` (also before the noise scale has settled)."""
        current = _pair(current)
        if noise_scale is None or updates < MIN_UPDATES or not math.isfinite(noise_scale):
            return current
        best = self.best(noise_scale)
        if current not in self.step_table:
            return best
        if self.goodput(best, noise_scale) > (1 + self.hysteresis) * self.goodput(current, noise_scale):
            return best
        return current


def step_table(
    predict: Callable[[int, int], float], configs: list[tuple[int, int]]
) -> dict[tuple[int, int], float]:
    """``predict(per_replica, accumulation)`` seconds for every configuration."""
    return {c: float(predict(*c)) for c in configs}


def _pair(config: Any) -> tuple[int, int]:
    """A (per-replica batch, accumulation) as a tuple (a JSON list or a tuple)."""
    b, k = config
    return int(b), int(k)
