"""Pricing gossip on each rank's own clock, and the consensus distance its topology leaves.

Step time (the ranks' clocks as costmodel/consistency.py runs them, one row per rank):

- asynchronous gossip (runtime/async_gossip.py) never waits for a neighbour. Rank r's period is
  its own work, ``compute x slowdown_r`` (+ jitter) + optimizer, plus its window traffic, one
  message of the gossiped bytes ``n`` to each out-neighbour at its own clock on the calibrated
  point-to-point link (``CostModel.links``: intra-host, or inter-host to a rank on another host;
  a dynamic topology averaged over its period), plus its combine's passes over ``n`` in memory
  (``PASSES``, counted from the runtime's tensor operations). Samples per second =
  ``sum_r batch / period_r``. The runtime waits for step c's sends only before step c+1's; they
  are priced as not overlapping the next compute (on CPU ranks the transfer's copies share the
  cores the compute runs on). A rank whose in-neighbours send more than its link carries slows
  them all to what it carries (as the servers' links bound asynchronous PS).
- synchronous gossip (runtime/gossip.py): each step a rank exchanges with its in- and
  out-neighbours and waits for them, ``start_i(c+1) = max_{j in N(i) + i} end_j(c) + exchange``:
  over a connected graph a persistent straggler sets everyone's pace, and jitter costs an order
  statistic over the neighbourhoods (over every rank on a full graph: ``E[max]``, as
  consistency.simulate's synchronous clocks). Without a slowdown or jitter the kernels' own price
  (evaluate.py) stands unchanged.

Consensus distance ``D = mean_r |x_r - mean x|^2`` (Koloskova et al. 2020, "A unified theory of
decentralized SGD with changing topology and local updates", ICML; Kong et al. 2021, "Consensus
control for decentralized deep learning", ICML): each step every rank adds its update u_r and
combines, ``X <- W^T (X + U)``, so the deviations from the mean follow ``Xi <- W^T (Xi + U)(I - J)``.
With updates independent step to step whose spread ``u^2 = mean_r |u_r - mean u|^2``, D settles
at ``sum_{k>=1} |(W^T)^k (I - J)|^2 u^2``, at most ``u^2 lambda^2 / (1 - lambda^2)`` with
``lambda = 1 - gap`` (the second-largest eigenvalue modulus; equal for the built-ins, whose
static matrices are normal): ``K = lambda^2 / (1 - lambda^2)`` is the topology's factor, 0 for a
graph that averages exactly in one step (full). AWC applies the step's update after combining:
``K + 1``. A schedule (dynamic topology) sums the norms of its products over its period's
phases, since its per-step gap hides the spread between phases (one-peer exp2 averages exactly
only after its period). Asynchronously a rank mixes only what has landed: from in-neighbour j,
``min(1, period_r / period_j)`` messages per own step; with ``h`` that share averaged over the
edges, each own step is the lazy mix ``(1 - h) I + h W`` (eigenvalues ``1 - h + h mu``), whose
K grows as ``h`` falls (messages in flight, one step old, are not counted).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from distlab.costmodel import consistency
from distlab.costmodel.collectives import LINK_CLASSES
from distlab.errors import DistlabError

# the runtime's passes over the n gossiped bytes per own step (fixed, per out-neighbour, per
# in-neighbour), one per elementwise tensor operation of runtime/async_gossip.py and window.py.
# push-sum: flatten, numerator x p, keep its share (in place), value z / p, write back; a weighted
# copy per out-neighbour; per in-neighbour: the collect's add (1.5; the receiver lands the first
# message after a collect without a copy) and the disagreement (divide, subtract, square and sum:
# 3.5) every MEASURE_EVERY = 8 clocks (0.44). average: flatten, the self share (a new tensor: the
# put still reads the old one), write back; none per out-neighbour (weight 1 sends the tensor
# itself); per in-neighbour: the update's add (1.5) and the disagreement (0.44).
PASSES = {"push_sum": (5.0, 1.0, 1.94), "average": (3.0, 0.0, 1.94)}
_TAIL_STEPS = 2048  # a schedule's consensus sum: steps summed before its geometric tail


def is_async(strategy: Any) -> bool:
    """The strategy gossips asynchronously (``GossipConfig.asynchronous``)."""
    g = getattr(strategy, "gossip", None)
    return g is not None and bool(g.asynchronous)


def check_slowdown(slowdown: Mapping[int, float] | None, world: int) -> dict[int, float]:
    """``{rank: factor}`` as ``lab.launch(slowdown=)`` takes it, or one ``DistlabError`` naming the
    entry: a rank of the strategy (0 to world - 1), a finite factor >= 1."""
    if not slowdown:
        return {}
    if not isinstance(slowdown, Mapping):
        raise DistlabError(
            f"slowdown: expected {{rank: factor}}, e.g. {{1: 1.5}}; got {type(slowdown).__name__}"
        )
    out = {}
    for rank, factor in slowdown.items():
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
            raise DistlabError(f"slowdown[{rank!r}]: not a rank of this strategy (0 to {world - 1})")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor < math.inf:
            raise DistlabError(
                f"slowdown[{rank}]: factor {factor!r} must be a number >= 1 "
                "(1.5: that rank computes 1.5x slower)"
            )
        out[int(rank)] = float(factor)
    return out


def check_jitter(jitter: float) -> float:
    """A jitter share >= 0 (0.2: an exponential extra of 20% of the compute on average)."""
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter < math.inf:
        raise DistlabError(f"jitter: {jitter!r} must be a finite number >= 0 (0.2: 20% of the compute)")
    return float(jitter)


def check_update_spread(update_spread: float | None) -> float | None:
    """u^2, the update spread between ranks: None (unknown) or a number >= 0."""
    if update_spread is None:
        return None
    if (
        isinstance(update_spread, bool)
        or not isinstance(update_spread, (int, float))
        or not update_spread >= 0
    ):
        raise DistlabError(f"update_spread: {update_spread!r} must be a number >= 0 (u^2, squared units)")
    return float(update_spread)


def weights(topology: Any) -> list[np.ndarray]:
    """Each step's weight matrix (``weights[i, j]``: the edge i -> j) of a topology or schedule."""
    if hasattr(topology, "at"):
        return [np.asarray(topology.at(t).weights, dtype=float) for t in range(topology.period)]
    return [np.asarray(topology.weights, dtype=float)]


def edges(ws: Sequence[np.ndarray]) -> np.ndarray:
    """(n, n): the share of a period's steps in which i sends to j (self loops excluded)."""
    n = ws[0].shape[0]
    return np.mean([(w != 0) & ~np.eye(n, dtype=bool) for w in ws], axis=0)


def message_times(cm: Any, resources: Any, strategy: Any, nbytes: float) -> np.ndarray:
    """(n, n) seconds of one message of ``nbytes`` from rank i to rank j on the point-to-point
    link between their hosts (``CostModel.links``: intra-host or inter-host)."""
    links = cm.links(resources)
    hosts = np.array([r.host for r in strategy.ranks])
    apart = hosts[:, None] != hosts[None, :]
    return np.where(apart, links[LINK_CLASSES[-1]].time(nbytes), links[LINK_CLASSES[0]].time(nbytes))


def window_traffic(cm: Any, resources: Any, strategy: Any, nbytes: float) -> np.ndarray:
    """Seconds each rank sends per own step: one message of ``nbytes`` to each out-neighbour at
    its own clock (``message_times``), averaged over a dynamic topology's period."""
    from distlab.strategy.execution import for_strategy

    f = edges(weights(for_strategy(strategy)))
    return (f * message_times(cm, resources, strategy, nbytes)).sum(axis=1)


@dataclass(frozen=True)
class ConsensusEstimate:
    """What consensus distance a topology leaves: ``gap`` its spectral gap (a schedule's per step),
    ``factor`` K (``distance = K u^2``, ATC; AWC's adds one u^2), ``heard`` the share of in-neighbours'
    messages a rank takes in per own step (1 synchronously), ``distance`` K u^2 when u^2 was given."""

    topology: str
    world: int
    gap: float
    factor: float
    heard: float = 1.0
    awc: bool = False
    distance: float | None = None

    @property
    def lam(self) -> float:
        """The per-step contraction that gives K: ``K = lam^2 / (1 - lam^2)``."""
        return math.sqrt(self.factor / (1.0 + self.factor)) if math.isfinite(self.factor) else 1.0

    def note(self) -> str:
        """The estimate in a sentence, as a prediction's note shows it."""
        k = self.factor + (1.0 if self.awc else 0.0)
        at = "" if self.distance is None else f", {self.distance:.3g} at the u^2 given"
        text = (
            f"consensus: {self.topology} over {self.world} ranks, spectral gap {self.gap:.3f}: the ranks' "
            f"parameters settle within about {k:.3g} x u^2 of their mean{at} (u^2: one step's update "
            "spread between ranks; Koloskova et al. 2020)"
        )
        if self.heard < 1.0:
            text += (
                f"; asynchronously a rank takes in {self.heard:.0%} of its neighbours' messages per own step"
            )
        return text


def heard_share(ws: Sequence[np.ndarray], periods: Sequence[float] | None) -> float:
    """Mean over edges i -> j of ``min(1, period_j / period_i)``: the messages j takes in per own step."""
    if periods is None:
        return 1.0
    p, f = np.asarray(periods, dtype=float), edges(ws)
    if not f.sum():
        return 1.0
    # to two decimals: the clocks' natural spread (a percent or so) is no rank falling behind
    return round(float((f * np.minimum(1.0, p[None, :] / p[:, None])).sum() / f.sum()), 2)


@lru_cache(maxsize=256)
def _factor(key: tuple[Any, ...], h: float) -> float:
    ws = [np.array(w) for w in key]
    n = ws[0].shape[0]
    if n == 1:
        return 0.0
    lazy = [(1.0 - h) * np.eye(n) + h * w.T for w in ws]  # X <- W^T X, as a lazy mix
    if len(ws) == 1:
        mu = np.linalg.eigvals(lazy[0])
        lam = float(np.sort(np.abs(np.delete(mu, np.argmin(np.abs(mu - 1.0)))))[-1])
        return lam**2 / (1.0 - lam**2) if lam < 1.0 - 1e-12 else math.inf
    centre, period, total = np.eye(n) - np.full((n, n), 1.0 / n), len(ws), 0.0
    for phase in range(period):  # the mean over the phase a rank's deviation enters at
        m, terms = centre, []
        for k in range(_TAIL_STEPS):
            m = lazy[(phase + k) % period] @ m
            terms.append(float(np.linalg.norm(m, 2)) ** 2)
            if terms[-1] < 1e-12:
                break
        else:  # not yet contracted: the rest as a geometric tail at the last period's rate
            r = (terms[-1] / terms[-1 - period]) ** (1.0 / period) if terms[-1 - period] > 0 else 1.0
            if r >= 1.0:
                return math.inf
            terms.append(terms[-1] * r / (1.0 - r))
        total += sum(terms)
    return total / period


def expected_consensus(
    topology: Any,
    update_spread: float | None = None,
    periods: Sequence[float] | None = None,
    mode: str | None = None,
) -> ConsensusEstimate:
    """The consensus distance to expect from ``topology`` (a ``distlab.topology`` topology or
    schedule, or a gossip ``Strategy``: its own over its ranks), with the update spread
    ``update_spread`` (u^2, when known) and, asynchronously, each rank's ``periods`` (seconds per
    own step; None: all keep pace). ``mode``: the gossip's (a strategy's own by default); AWC
    adds one u^2. The formulas are the module's docstring's."""
    if getattr(topology, "gossip", None) is not None:
        from distlab.strategy.execution import for_strategy

        mode = mode or topology.gossip.mode
        topology = for_strategy(topology)
    if not hasattr(topology, "spectral_gap"):
        raise DistlabError(f"expected_consensus: {topology!r} is neither a topology nor a gossip strategy")
    ws = weights(topology)
    h = heard_share(ws, periods)
    key = tuple(tuple(map(tuple, w)) for w in ws)
    k = _factor(key, h)
    spread = check_update_spread(update_spread)
    awc = mode == "awc"
    dist = None if spread is None else spread * (k + (1.0 if awc else 0.0))
    name = str(getattr(topology, "name", "topology"))
    return ConsensusEstimate(name, ws[0].shape[0], float(topology.spectral_gap()), k, h, awc, dist)


def neighbour_clocks(x: np.ndarray, waits: Sequence[np.ndarray], exchange: float) -> np.ndarray:
    """Each rank's mean period when, every clock c, rank i does its own work ``x[i, c]``, waits for
    the ranks ``waits[c % len(waits)][i]`` (itself included) to finish theirs, then exchanges for
    ``exchange`` seconds (synchronous gossip's clocks); the first fifth of the clocks warm up."""
    n, steps = x.shape
    warm = min(steps // 5, 50)
    ready, begin = np.zeros(n), np.zeros(n)
    for c in range(steps):
        end = ready + x[:, c]
        ready = np.where(waits[c % len(waits)], end[None, :], -np.inf).max(axis=1) + exchange
        if c == warm - 1:
            begin = ready
    return (ready - begin) / (steps - warm)


def periods_text(periods: np.ndarray) -> str:
    ms = [f"{p * 1e3:,.2f}" for p in periods]
    if len(ms) > 8:
        ms = [f"{np.min(periods) * 1e3:,.2f} (fastest)", f"{np.max(periods) * 1e3:,.2f} (slowest)"]
    return ", ".join(ms) + " ms"


def price(
    cm: Any,
    profile: Any,
    resources: Any,
    strategy: Any,
    slowdown: Mapping[int, float] | None = None,
    jitter: float = 0.0,
    noise: float = consistency.DEFAULT_NOISE,
    optimizer: str | None = None,
    base: Any = None,
    update_spread: float | None = None,
) -> Any:
    """The cost model's ``Prediction`` of a gossip strategy on each rank's clock (the module's
    docstring): asynchronous at each rank's own pace, synchronous at its neighbourhoods' (the
    kernels' own figure when no rank is slowed and nothing jitters). ``slowdown`` ({rank: factor})
    and ``jitter`` as ``lab.launch`` takes them; ``noise`` each rank's natural step-to-step spread;
    ``base``: the strategy's prediction as its kernels price it (``CostModel.predict`` passes its
    own); ``update_spread``: u^2, for the consensus distance. ``step_time`` is the mean period
    over ranks; a note gives each rank's, another the consensus (``expected_consensus``)."""
    if getattr(strategy, "gossip", None) is None:
        raise DistlabError(f"gossip pricing: strategy {strategy.name} has no gossip settings")
    slow, jitter = check_slowdown(slowdown, strategy.world), check_jitter(jitter)
    check_update_spread(update_spread)
    if base is None:
        base = cm.predict(profile, resources, strategy, optimizer=optimizer, clocks=False)
    if is_async(strategy):
        return _asynchronous(cm, profile, resources, strategy, slow, jitter, noise, base, update_spread)
    consensus = consensus_notes(strategy, update_spread)
    if not slow and not jitter:
        return dataclasses.replace(base, notes=(*base.notes, *consensus))
    from distlab.strategy.execution import for_strategy

    b, n = base.breakdown, strategy.world
    ranks = [consistency.RankTime(b["compute"], noise, b["optimizer"])] * n
    x = consistency.draw(ranks, slow, jitter)
    waits = [
        f | f.T | np.eye(n, dtype=bool) for f in (edges([w]) > 0 for w in weights(for_strategy(strategy)))
    ]
    periods = neighbour_clocks(x, waits, b["comm"])
    step = float(np.mean(periods))
    note = (
        f"synchronous gossip: every rank waits for its neighbours each step; periods {periods_text(periods)}"
    )
    return dataclasses.replace(
        base,
        step_time=step,
        breakdown={**b, "comm": max(0.0, step - b["compute"] - b["optimizer"])},
        throughput=float(base.global_batch // n * np.sum(1.0 / periods)),
        notes=(*base.notes, note, *consensus),
    )


def consensus_notes(strategy: Any, update_spread: float | None, periods: Any = None) -> tuple[str, ...]:
    """The consensus a gossip strategy leaves, as a prediction's note (none for a topology this
    version cannot build: the kernels' figure still stands)."""
    try:
        return (expected_consensus(strategy, update_spread, periods, strategy.gossip.mode).note(),)
    except DistlabError:
        return ()


def _asynchronous(
    cm: Any,
    profile: Any,
    resources: Any,
    strategy: Any,
    slow: dict[int, float],
    jitter: float,
    noise: float,
    base: Any,
    update_spread: float | None,
) -> Any:
    """``price`` of asynchronous gossip: every rank at its own pace (the module's docstring)."""
    from distlab.strategy.execution import for_strategy

    b, n, mode = base.breakdown, strategy.world, strategy.gossip.mode
    nbytes = float(cm.compile(profile, strategy).gossip_bytes)
    f = edges(weights(for_strategy(strategy)))
    d_out, d_in = f.sum(axis=1), f.sum(axis=0)
    send = window_traffic(cm, resources, strategy, nbytes)
    fixed, per_out, per_in = PASSES.get(mode, PASSES["push_sum"])
    prm = cm.params
    combine = (fixed + per_out * d_out + per_in * d_in) * nbytes * prm.copy_per_byte
    combine = combine + d_in * nbytes * prm.gossip_per_byte
    other = max(0.0, b["comm"] - base.detail.get("gossip", 0.0))  # the kernels' non-gossip exchanges
    own = send + combine + other
    ranks = [consistency.RankTime(b["compute"], noise, b["optimizer"] + float(own[r])) for r in range(n)]
    batch = base.global_batch // n
    got = consistency.simulate(ranks, consistency.ASYNC, 0.0, 0.0, batch, slow, jitter, read_staleness=False)
    periods = np.asarray(got.periods)
    compute = float(np.mean(periods - own)) - b["optimizer"]  # forward and backward, slowed and varied
    notes = [
        f"asynchronous gossip ({mode}): every rank at its own pace, no wait for a neighbour; periods "
        f"{periods_text(periods)}; window traffic {np.mean(send) * 1e3:.3f} ms ({np.mean(d_out):.3g} "
        f"messages of {nbytes / 1e3:,.1f} kB) and combine {np.mean(combine) * 1e3:.3f} ms per own step"
    ]
    t = message_times(cm, resources, strategy, nbytes)
    busy = float(np.max((f * t / periods[:, None]).sum(axis=0)))  # each rank's link, receiving
    if busy > 1.0:  # a receiver's link carries less than its in-neighbours send: they slow to it
        periods = periods * busy
        notes.append(f"asynchronous gossip bounded by the busiest rank's incoming link ({busy:.2f}x)")
    step = float(np.mean(periods))
    notes += consensus_notes(strategy, update_spread, periods.tolist())
    return dataclasses.replace(
        base,
        step_time=step,
        breakdown={"compute": compute, "comm": step - compute - b["optimizer"], "optimizer": b["optimizer"]},
        detail={**base.detail, "gossip": float(np.mean(send + combine))},
        throughput=float(batch * np.sum(1.0 / periods)),
        notes=(*base.notes, *notes),
    )


def rerank(cm: Any, df: Any, profile: Any, resources: Any, optimizer: str | None) -> Any:
    """``CostModel.rank``'s table with every asynchronous gossip plan priced at each rank's own
    pace (``CostModel.predict`` routes it here); a goodput column follows its throughput."""
    rows = [i for i, plan in enumerate(df["plan"]) if is_async(plan)]
    if not rows:
        return df
    df = df.copy()
    for i in rows:
        p = cm.predict(profile, resources, df["plan"].iloc[i], optimizer=optimizer)
        row = (p.throughput, p.step_time, p.breakdown["compute"], p.breakdown["comm"])
        df.loc[i, ["throughput", "step_time", "compute", "comm"]] = row
    if "goodput" in df and "efficiency" in df:
        df["goodput"] = df["throughput"] * df["efficiency"]
    return df
