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

from distlab.costmodel.convergence import counted_g, key_of
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


def draw(
    ranks: Sequence[RankTime],
    slowdown: Mapping[int, float] | None = None,
    jitter: float = 0.0,
    steps: int = 400,
    seed: int = 0,
) -> np.ndarray:
    """(rank, clock) seconds each rank spends outside communication: ``base`` times its
    ``slowdown`` plus an exponential ``jitter`` share, plus ``rest``, the whole spread by its
    ``noise`` (a normal share, clipped at 0.2 of the mean)."""
    n, rng = len(ranks), np.random.default_rng(seed)
    slow = np.array([float((slowdown or {}).get(i, 1.0)) for i in range(n)])
    base = np.array([r.base for r in ranks], dtype=float)
    rest = np.array([r.rest for r in ranks], dtype=float)
    noise = np.array([r.noise for r in ranks], dtype=float)
    factor = slow[:, None] + jitter * rng.exponential(1.0, (n, steps))
    natural = np.clip(1.0 + noise[:, None] * rng.standard_normal((n, steps)), 0.2, None)
    return (base[:, None] * factor + rest[:, None]) * natural


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
    read_staleness: bool = True,
) -> ConsistencyPrediction:
    """Run ``steps`` clocks of every rank at ``staleness`` (0: synchronous PS, whose exchange is
    ``push + pull`` after the slowest; s > 0: SSP; ``ASYNC``: no gate). ``push``/``pull``: seconds
    to send a step's gradients / receive the values; ``server_rate``: the most pushes per second
    the servers' links carry (asynchronous PS's bound), None: unbounded. ``read_staleness=False``
    skips the staleness the ranks read (gossip, which has no servers to read from)."""
    if not ranks:
        raise DistlabError("consistency: no ranks to price")
    if staleness is not None and (not isinstance(staleness, int) or staleness < 0):
        raise DistlabError(f"consistency: staleness {staleness!r} must be an integer >= 0 or None (async)")
    n = len(ranks)
    x = draw(ranks, slowdown, jitter, steps, seed)
    done = np.zeros((n, steps))  # when each rank's push of each clock lands
    start = np.zeros(n)
    seen = np.zeros((n, steps))
    landed = np.zeros((n, n), dtype=int)  # pushes of each writer (column) landed by each reader's start
    writers = np.arange(n)[None, :]
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
        if not read_staleness:
            continue
        # the staleness read: this rank's next clock minus the slowest clock pushed by then. A
        # writer's pushes land in clock order and a reader's starts only grow, so each count only
        # moves forward: advance them all together until none can
        while True:
            nxt = done[writers, np.minimum(landed, c)] <= start[:, None]
            step = (landed <= c) & nxt
            if not step.any():
                break
            landed += step
        seen[:, c] = (c + 1) - landed.min(1)
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
    step = np.asarray(df["step"], dtype=float)
    keep = step >= step.min() + max(1, (step.max() - step.min()) // 5)

    def col(name: str) -> np.ndarray:
        return np.asarray(df[name], dtype=float)[keep] if name in df else np.zeros(int(keep.sum()))

    own = np.maximum(col("step_time") - col("comm_time") - col("delay"), 1e-6)
    compute = np.minimum(col("compute"), own) if "compute" in df else own
    ranks = np.asarray(df["rank"])[keep]
    out = []
    for rank in np.unique(ranks):
        t, c = own[ranks == rank], float(compute[ranks == rank].mean())
        noise = float(t.std(ddof=1) / t.mean()) if len(t) > 1 else 0.0
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


#: the step-to-step spread the cost-model path assumes (a share of the step), a default no run
#: was fitted to; the path from a run (``rank_times``) measures each rank's own instead
DEFAULT_NOISE = 0.05


def exchange(cm: Any, resources: Any, strategy: Any, profile: Any) -> tuple[float, float, float | None]:
    """(push, pull, server_rate) of the stale runtime: each worker sends one flat message of
    each server's gradients and receives one of its values, one server after the other (the
    calibrated point-to-point link: in-host or inter-host, the slower where ranks span hosts);
    a server's link carries at most ``bandwidth / (2 x its bytes)`` pushes per second."""
    from distlab.costmodel.collectives import LINK_CLASSES

    links = cm.links(resources)
    hosts = {r.host for r in strategy.ranks}
    link = links[LINK_CLASSES[-1] if len(hosts) > 1 else LINK_CLASSES[0]]
    sizes = {v.name: v.nbytes for v in profile.variables}
    per_server: dict[int, float] = {}
    for p in strategy.variables:
        for s in p.syncs:
            if s.kind == "ps":
                share = sizes.get(p.name, 0.0) / (p.partition.shards if p.partition is not None else 1)
                per_server[s.server] = per_server.get(s.server, 0.0) + share
    one_way = sum(link.time(b) for b in per_server.values())
    busiest = max(per_server.values(), default=0.0)
    rate = link.bandwidth / (2 * busiest) if busiest else None
    return one_way, one_way, rate


def price(
    cm: Any,
    profile: Any,
    resources: Any,
    strategy: Any,
    slowdown: Mapping[int, float] | None = None,
    jitter: float = 0.0,
    noise: float = DEFAULT_NOISE,
    optimizer: str | None = None,
    g: float | None = None,
    base: Any = None,
) -> Any:
    """The cost model's ``Prediction`` of a PS strategy at its consistency: every rank computes the
    model's predicted forward and backward (and its optimizer), spread by ``noise``, slowed by
    ``slowdown`` and varied by ``jitter``; the exchange is the synchronous kernels' (s = 0) or
    the stale runtime's (``exchange``). ``g``: steps to a target loss relative to synchronous
    (``Lab.probe_staleness``): efficiency 1/g, goodput = throughput / g (a g below 1 counts as 1:
    ``convergence.counted_g``). ``base``: the strategy's prediction as its kernels price it
    (``CostModel.predict`` passes its own)."""
    import dataclasses

    base = base if base is not None else cm.predict(profile, resources, strategy, optimizer=optimizer)
    sync, s = strategy.consistency
    staleness = None if not sync else s
    b = base.breakdown
    ranks = [RankTime(b["compute"], noise, b["optimizer"])] * strategy.world
    if staleness == 0:
        push, pull, rate = b["comm"] / 2, b["comm"] / 2, None
    else:
        push, pull, rate = exchange(cm, resources, strategy, profile)
    got = simulate(
        ranks, staleness, push, pull, base.global_batch // strategy.world, slowdown, jitter, server_rate=rate
    )
    if g is not None and not g > 0:
        raise DistlabError(f"g: {g!r} is not a positive number of steps relative to synchronous")
    # the parts add up to the clocks' step: a draw whose noise came out below its mean shows as compute
    comm = max(0.0, got.step_time - b["compute"] - b["optimizer"])
    eff = 1.0 / max(g, 1.0) if g else None  # below 1 counts as 1 (convergence.counted_g says why)
    notes = (
        base.notes
        + got.notes
        + (
            (
                f"consistency {got.label}: each rank's steps run through the clocks (consistency.py); "
                f"staleness read {got.staleness_seen:.1f} on average",
            )
            if staleness != 0
            else ()
        )
        + tuple(n for n in ((counted_g(strategy, {key_of(strategy): g})[1],) if g else ()) if n)
    )
    return dataclasses.replace(
        base,
        step_time=got.step_time,
        breakdown={**b, "comm": comm, "compute": got.step_time - b["optimizer"] - comm},
        throughput=got.throughput,
        efficiency=eff if eff is not None else base.efficiency,
        goodput=got.throughput * eff if eff is not None else base.goodput,
        notes=notes,
    )


def smoothed_loss(records: Any, window: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(seconds since the first record, the mean of the last ``window`` losses of every rank) in
    the order the steps ended; ``window`` defaults to two steps of every rank."""
    import pandas as pd

    df = pd.DataFrame(records).sort_values("wall_time")
    if df.empty:
        raise DistlabError("consistency: the run has no step records")
    w = window or 2 * int(df["rank"].nunique())
    t = df["wall_time"].to_numpy(dtype=float)
    return t - t[0], np.asarray(df["loss"].rolling(w, min_periods=w).mean(), dtype=float)


def steps_to(records: Any, target: float) -> float:
    """Steps of every rank (pushes) before the smoothed loss first reaches ``target``; NaN if never."""
    _, loss = smoothed_loss(records)
    hit = np.flatnonzero(loss <= target)
    return float(hit[0] + 1) if len(hit) else float("nan")


def time_to(records: Any, target: float) -> float:
    """Seconds before the smoothed loss first reaches ``target``; NaN if never."""
    t, loss = smoothed_loss(records)
    hit = np.flatnonzero(loss <= target)
    return float(t[hit[0]]) if len(hit) else float("nan")


def statistical_cost(runs: Mapping[Any, Any], target_at: float = 0.7) -> dict[Any, float]:
    """g(s) from short runs of the same model at each staleness (``runs``: staleness -> records,
    with the synchronous run under key 0): steps to a target loss over the synchronous run's
    steps to it, the target being the synchronous run's smoothed loss at ``target_at`` of its
    steps (as AdaptDL measures statistical efficiency, on the user's own model and data). A
    staleness that never reaches the target gets its steps so far over that (a lower bound)."""
    if 0 not in runs:
        raise DistlabError("consistency: the probe needs its synchronous run (staleness 0) for the target")
    _, loss0 = smoothed_loss(runs[0])
    finite = np.flatnonzero(np.isfinite(loss0))
    if not len(finite):
        raise DistlabError(
            "consistency: the synchronous probe ran too few steps to smooth its loss; give it more"
        )
    target = float(loss0[finite[min(len(finite) - 1, int(target_at * len(loss0)))]])
    ref = steps_to(runs[0], target)
    out = {}
    for s, records in runs.items():
        n = steps_to(records, target)
        out[s] = (n if n == n else float(len(records))) / ref
    return out


def rerank(
    cm: Any,
    df: Any,
    profile: Any,
    resources: Any,
    optimizer: str | None,
    staleness_cost: Mapping[Any, float] | None,
) -> Any:
    """``CostModel.rank``'s table with every stale or asynchronous PS plan priced at its
    consistency, goodput recomputed with its throughput, and a ``note`` column
    (``convergence.counted_g``).

    Without ``staleness_cost`` the figures are throughput (or the batch's goodput, with a noise
    scale) and every stale or asynchronous plan, PS or gossip, carries ``convergence.UNCOUNTED``.
    With it (g per staleness, ``Lab.probe_staleness``), efficiency is divided by each plan's g and
    goodput = throughput x efficiency; a plan whose staleness was not probed is unpriced: goodput
    NaN (ranked after every priced plan) and the note saying what to probe."""
    df = df.copy()
    for i, plan in enumerate(df["plan"]):
        if plan.stale:
            p = price(cm, profile, resources, plan, optimizer=optimizer)
            df.loc[i, ["throughput", "step_time", "comm"]] = [p.throughput, p.step_time, p.breakdown["comm"]]
    counted = [counted_g(plan, staleness_cost) for plan in df["plan"]]
    if staleness_cost:
        eff = df["efficiency"].to_numpy(dtype=float) if "efficiency" in df else np.ones(len(df))
        df["efficiency"] = eff / np.asarray([g for g, _ in counted])
    if "efficiency" in df:  # goodput follows the throughput the clocks priced
        df["goodput"] = df["throughput"] * df["efficiency"]
    df["note"] = [n for _, n in counted]
    return df
