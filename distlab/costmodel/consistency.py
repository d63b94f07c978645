"""Pricing a PS's consistency: synchronous, stale-synchronous (staleness s) and asynchronous, from
each rank's step-time distribution (wave3-anchors section 3).

Each rank's compute per step is drawn from its own distribution: a base (the cost model's
compute, or the rank's mean measured in a run), its ``slowdown`` factor, the asked-for
``jitter`` (an exponential extra share of mean ``jitter``, as ``lab.launch(jitter=)`` waits) and
its natural variation (a normal share, ``noise``: the spread measured step to step). The clocks
are then run forward, as the runtime runs them:

- synchronous: every rank starts clock c when the slowest finished c-1, plus the exchange:
  ``E[max_i X_i] + comm``, the order statistic a straggler or jitter pays every step;
- staleness s: rank i starts clock c once its own push of c-1 is answered and every rank has
  pushed clock c-s-1: jitter is absorbed over s+1 steps, a persistently slow rank is not (the
  long-run rate is the slowest rank's mean);
- asynchronous: each rank at its own pace, ``push + compute + pull`` per step, bounded by what
  the servers' links carry.

A Monte-Carlo run of a few hundred clocks gives each rank's mean period; samples per second is
the sum over ranks of batch / period.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab.errors import DistlabError

ASYNC = None  # staleness of an asynchronous PS (no gate)


@dataclass(frozen=True)
class RankTime:
    """One rank's own time per step, outside communication: ``base`` seconds of forward and
    backward (what a slowdown or jitter scales, as the runtime's straggler waits a share of
    them), ``rest`` seconds of the rest (optimizer, data, Python), ``noise`` the whole's natural
    step-to-step spread (standard deviation over mean)."""

    base: float
    noise: float = 0.0
    rest: float = 0.0


@dataclass(frozen=True)
class ConsistencyPrediction:
    """What a consistency costs: each rank's mean period (seconds per step, waits included),
    samples per second over all ranks, and the staleness the ranks read on average."""

    staleness: int | None
    periods: tuple[float, ...]
    throughput: float
    staleness_seen: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def step_time(self) -> float:
        """The mean period over ranks."""
        return float(np.mean(self.periods))

    @property
    def label(self) -> str:
        return "async" if self.staleness is None else f"s={self.staleness}"


def simulate(
    ranks: Sequence[RankTime],
    staleness: int | None,
    push: float,
    pull: float,
    batch: int,
    slowdown: Mapping[int, float] | None = None,
    jitter: float = 0.0,
    steps: int = 400,
    seed: int = 0,
    server_rate: float | None = None,
) -> ConsistencyPrediction:
    """Run ``steps`` clocks of every rank at ``staleness`` (0: synchronous PS, whose exchange is
    ``push + pull`` after the slowest; s > 0: SSP; ``ASYNC``: no gate). ``push``/``pull``: seconds
    to send a step's gradients / receive the values; ``server_rate``: the most pushes per second
    the servers' links carry (asynchronous PS's bound), None: unbounded."""
    if not ranks:
        raise DistlabError("consistency: no ranks to price")
    if staleness is not None and (not isinstance(staleness, int) or staleness < 0):
        raise DistlabError(f"consistency: staleness {staleness!r} must be an integer >= 0 or None (async)")
    n, rng = len(ranks), np.random.default_rng(seed)
    slow = np.array([float((slowdown or {}).get(i, 1.0)) for i in range(n)])
    base = np.array([r.base for r in ranks], dtype=float)
    rest = np.array([r.rest for r in ranks], dtype=float)
    noise = np.array([r.noise for r in ranks], dtype=float)
    factor = slow[:, None] + jitter * rng.exponential(1.0, (n, steps))
    natural = np.clip(1.0 + noise[:, None] * rng.standard_normal((n, steps)), 0.2, None)
    x = (base[:, None] * factor + rest[:, None]) * natural  # (rank, clock) seconds outside communication
    done = np.zeros((n, steps))  # when each rank's push of each clock lands
    start = np.zeros(n)
    seen = np.zeros((n, steps))
    for c in range(steps):
        if staleness == 0:  # synchronous: the slowest's push, then the servers' broadcast
            begin = (done[:, c - 1].max() + pull) if c else 0.0
            start[:] = begin
        done[:, c] = start + x[:, c] + push
        if staleness == 0:
            continue
        if staleness is None or c - staleness < 0:
            gate = np.zeros(n)
        else:
            gate = np.full(n, done[:, c - staleness].max())
        start = np.maximum(done[:, c], gate) + pull
        # the staleness read: this rank's next clock minus the slowest clock pushed by then
        pushed = (done[:, : c + 1][None, :, :] <= start[:, None, None]).sum(-1)  # (reader, writer)
        seen[:, c] = (c + 1) - pushed.min(1)
    warm = min(steps // 5, 50)
    ends = done[:, -1] if staleness != 0 else np.full(n, done[:, -1].max() + pull)
    begins = done[:, warm - 1] if warm else np.zeros(n)
    periods = (ends - begins) / (steps - warm)
    notes: list[str] = []
    rate = float(np.sum(1.0 / periods))
    if server_rate is not None and staleness is None and rate > server_rate:
        periods = periods * rate / server_rate
        notes.append(f"asynchronous pushes bounded by the servers' links: {server_rate:,.0f} per second")
    return ConsistencyPrediction(
        staleness,
        tuple(float(p) for p in periods),
        float(batch * np.sum(1.0 / periods)),
        float(seen[:, warm:].mean()) if staleness != 0 else 0.0,
        tuple(notes),
    )


def rank_times(records: Any) -> list[RankTime]:
    """Each rank's own time per step from a run's records (``run.metrics``): its step minus the
    communication it waited for and any asked-for delay, split into forward and backward (the
    records' ``compute``; all of it when a record has none) and the rest; ``noise``: that time's
    spread (its standard deviation over its mean) after the first fifth of the steps."""
    import pandas as pd

    df = pd.DataFrame(records)
    if df.empty:
        raise DistlabError("consistency: the run has no step records to read rank times from")
    df = df[df["step"] >= df["step"].min() + max(1, (df["step"].max() - df["step"].min()) // 5)]
    own = (df["step_time"] - df["comm_time"] - (df["delay"] if "delay" in df else 0.0)).clip(lower=1e-6)
    compute = df["compute"].clip(upper=own) if "compute" in df else own
    out = []
    for rank, t in own.groupby(df["rank"]):
        c = float(compute[df["rank"] == rank].mean())
        noise = float(t.std() / t.mean()) if len(t) > 1 else 0.0
        out.append(RankTime(c, noise, max(0.0, float(t.mean()) - c)))
    return out


def measured(records: Any, batch: int) -> dict[str, float]:
    """A run's own figures as ``simulate`` predicts them: samples per second (the sum over ranks
    of batch over its mean step, after the first fifth of the steps), the mean step, the mean
    staleness read (0 when the run recorded none)."""
    import pandas as pd

    df = pd.DataFrame(records)
    df = df[df["step"] >= df["step"].min() + max(1, (df["step"].max() - df["step"].min()) // 5)]
    periods = df.groupby("rank")["step_time"].mean()
    return {
        "throughput": float(batch * np.sum(1.0 / periods.to_numpy())),
        "step_time": float(periods.mean()),
        "staleness_seen": float(df["staleness"].mean()) if "staleness" in df else 0.0,
    }
