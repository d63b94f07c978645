"""How a shared Lab's scheduler prices a run: its speedup, its restart's cost, the strategy it resumes under.

The speedup at ``(hosts, replicas)`` comes from the Lab's calibrated cost model when it has one
and the run's model profile is known (``sched.speedup.StrategySpeedup``: ``cm.rank`` over the
candidate strategies), corrected by the run's own measured segments once it has some
(``with_measurements``); without a cost model, from the measured segments alone (linear where
none, as Pollux starts). A run that lets the scheduler choose (``strategy="auto"``) is priced at
the best strategy per allocation; any other at the strategy it runs.

A restart's cost (``sched.restart``) is the run's checkpoint bytes at the storage rates measured
once per Lab, plus its own measured relaunch: the seconds from its pause to its first step after
the resume, less the checkpoint's own write and read (counted by the bytes), so the two parts are
not counted twice.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from distlab.sched.policy import SpeedupFn
from distlab.sched.restart import checkpoint_bytes, estimate_relaunch, measure_storage, restart_seconds
from distlab.sched.speedup import StrategySpeedup, allocation_resources

WARMUP_STEPS = 3  # a segment's first steps after a (re)start are warm-up, not its throughput
STORAGE_PROBE_BYTES = 8 << 20  # a probe large enough that fsync's fixed cost is not the rate
# a run that lets the scheduler choose changes strategy only for a predicted gain above this: the
# cost model's ranking within a few percent is noise (ties are common at one replica), and each
# change re-plans every rank
SWITCH_MARGIN = 0.05
OPTIMIZER_STATES = {"adam": 2, "momentum": 1, "sgd": 0}  # copies of the weights a checkpoint adds


class ProfileTap(dict):
    """The Lab's profile cache (``runs.prepare.ProfileCache``) that also keeps the profiles the latest
    launch used, by per-replica batch (``taken()``): a shared Lab's scheduler prices the run with them."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[int, Any] = {}

    def get(self, key: Any, default: Any = None) -> Any:
        hit = super().get(key, default)
        if hit is not None and hit[0]() is not None:
            self.seen[int(key[1])] = hit[2]
        return hit

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.seen[int(key[1])] = value[2]

    def record(self, batch: int, profile: Any) -> None:
        """A profile a route made outside this cache (``lab.run``'s loop, profiled on its loader)."""
        self.seen[int(batch)] = profile

    def taken(self) -> dict[int, Any]:
        """The profiles looked up or made since the last call, by batch."""
        seen, self.seen = self.seen, {}
        return seen


def chosen_strategy(strategy: Any, shared: bool) -> tuple[Any, bool]:
    """A launch's strategy and whether the scheduler chooses it: ``"auto"`` starts as AllReduce and
    is re-chosen per allocation by a shared Lab's scheduler (with a cost model)."""
    from distlab.errors import LaunchError

    if not (isinstance(strategy, str) and strategy.lower() == "auto"):
        return strategy, False
    if not shared:
        raise LaunchError(
            "strategy='auto': only a shared Lab's scheduler chooses the strategy per allocation; start "
            "dl.Lab(..., scheduler='goodput'), or name a builder (lab.plan ranks them)"
        )
    return "AllReduce", True


def segment_throughputs(metrics: Any) -> dict[int, float]:
    """Samples per second at each world size a run has trained at (its latest segment at each),
    from rank 0's records after each (re)start's warm-up: the data position over the wall clock."""
    return {w: s["samples"] / s["seconds"] for w, s in _segments(metrics).items()}


def _segments(metrics: Any) -> dict[int, dict[str, float]]:
    """Rank 0's latest segment at each world after warm-up: its samples, seconds, steps and start."""
    if metrics is None or len(metrics) == 0 or "world" not in metrics:
        return {}
    r0 = metrics[metrics["rank"] == 0]
    out: dict[int, dict[str, float]] = {}
    for (_, world), seg in r0.groupby(["restart", "world"], sort=True):
        seg = seg.sort_values("step").iloc[WARMUP_STEPS:]
        if len(seg) < 3:
            continue
        dt = float(seg["wall_time"].iloc[-1] - seg["wall_time"].iloc[0])
        if dt > 0:
            out[int(world)] = {
                "samples": float(seg["samples"].iloc[-1] - seg["samples"].iloc[0]),
                "seconds": dt,
                "steps": float(len(seg) - 1),
                "start": float(seg["wall_time"].iloc[0]),
            }
    return out


def measured_speedup(throughputs: dict[int, float]) -> SpeedupFn | None:
    """A run's speedup at r replicas from its measured throughputs: exact where measured, linear
    beyond the nearest measured world below r (Pollux's start, speedup = replicas, where nothing is
    measured: None)."""
    if not throughputs:
        return None
    worlds = sorted(throughputs)
    one = throughputs[1] if 1 in throughputs else throughputs[worlds[0]] / worlds[0]

    def speedup(nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        out = []
        for r in np.asarray(replicas, dtype=int).ravel():
            below = [w for w in worlds if w <= r]
            w = below[-1] if below else worlds[0]
            out.append(throughputs[w] / one * r / w)
        return np.asarray(out, dtype=float).reshape(np.shape(replicas))

    return speedup


def measured_rows(metrics: Any, plans: Sequence[tuple[float, str, int]], batch: int) -> list[dict[str, Any]]:
    """``with_measurements``' rows: one per measured segment, its strategy and hosts those the run
    was given when the segment began (``plans``: (wall time, strategy name, hosts), oldest first)."""
    rows = []
    for world, seg in _segments(metrics).items():
        before = [p for p in plans if p[0] <= seg["start"]] or list(plans[:1])
        if not before:
            continue
        _, name, hosts = before[-1]
        rows.append(
            {
                "strategy": name,
                "num_nodes": max(1, min(hosts, world)),
                "num_replicas": world,
                "local_bsz": batch,
                "step_time": seg["seconds"] / seg["steps"],
            }
        )
    return rows


class Guarded:
    """A speedup the policy can always call: ``priced``'s, or ``fallback``'s (measured, else linear)
    at an allocation it cannot price (a strategy the candidates lack there, a plan the cost model
    refuses), so one run's pricing never stops a round."""

    def __init__(self, priced: SpeedupFn, fallback: SpeedupFn | None) -> None:
        self.priced, self.fallback = priced, fallback

    def __call__(self, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        try:
            out = np.asarray(self.priced(nodes, replicas), dtype=float)
            if np.isfinite(out).all():
                return out
        except Exception:  # noqa: BLE001 - priced otherwise below
            pass
        if self.fallback is not None:
            return self.fallback(nodes, replicas)
        return np.asarray(replicas, dtype=float)


class GuardedChoice(Guarded):
    """``Guarded`` for a run whose strategy the scheduler chooses: it also names the best strategy
    per allocation (``strategy_at``; the one it runs where the cost model cannot say)."""

    def __init__(self, priced: Any, fallback: SpeedupFn | None, current: str) -> None:
        super().__init__(priced, fallback)
        self.current = current

    def strategy_at(self, nodes: int, replicas: int) -> str:
        try:
            return self.priced.strategy_at(nodes, replicas)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - keep what it runs
            return self.current


class OwnStrategySpeedup:
    """The speedup of the one strategy a run was launched with, from a ``StrategySpeedup``'s rates
    (the run's own measurements applied): a run whose user named its strategy keeps it."""

    def __init__(self, priced: StrategySpeedup, name: str) -> None:
        self.priced, self.name = priced, name
        self.rate(1, 1)  # a strategy the candidates do not hold: KeyError now, not in a round

    def rate(self, nodes: int, replicas: int) -> float:
        return self.priced.rates(nodes, replicas)[self.name]

    def __call__(self, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        one = self.rate(1, 1)
        pairs = zip(
            np.asarray(nodes, dtype=int).ravel().tolist(), np.asarray(replicas, dtype=int).ravel().tolist()
        )
        out = [self.rate(max(1, min(n, r)), r) / one if r > 0 else 0.0 for n, r in pairs]
        return np.asarray(out, dtype=float).reshape(np.shape(replicas))


def run_speedup(job: Any, cost_model: Any, base: Any) -> tuple[SpeedupFn | None, str]:
    """A run's speedup function for this round and where it came from (module docstring)."""
    metrics = job.run.metrics
    measured = measured_speedup(segment_throughputs(metrics))
    if cost_model is None or job.profile is None:
        return measured, "measured" if measured is not None else "linear"
    rows = measured_rows(metrics, job.plans, int(job.run.batch_size))
    key = (id(cost_model), len(rows), tuple(r["step_time"] for r in rows))
    if job.priced is not None and job.priced[0] == key:
        return job.priced[1], job.priced[2]
    raw: StrategySpeedup | None = None
    try:
        kept = job.priced[3] if job.priced is not None else None
        if kept is not None and kept.cm is cost_model:  # its tables (cm.rank per allocation) kept
            priced = kept.with_measurements(rows or None)
        else:
            priced = StrategySpeedup(cost_model, job.profile, base, optimizer=job.optimizer)
            priced = priced.with_measurements(rows) if rows else priced
        raw, current = priced, job.run.strategy.name
        fn: SpeedupFn = (
            GuardedChoice(priced, measured, current)
            if job.chooses
            else Guarded(OwnStrategySpeedup(priced, current), measured)
        )
        basis = "cost model" + (" + measured" if rows else "")
    except Exception:  # noqa: BLE001 - a strategy the candidates lack, a profile the model cannot price
        fn, basis = measured, "measured" if measured is not None else "linear"  # type: ignore[assignment]
    job.priced = (key, fn, basis, raw)
    return fn, basis


def switch_to(job: Any, name: str | None, workers: Sequence[str], hosts: int) -> Any:
    """The Strategy (a candidate) a choosing run resumes under on ``workers``, or None to keep its
    own: the policy's pick (``name``; the cost model's best when the policy names none) beats the
    one it runs by more than ``SWITCH_MARGIN`` there."""
    fn = job.priced[3] if job.priced is not None else None
    if not job.chooses or fn is None:
        return None
    current = job.run.strategy.name
    try:
        name = name or fn.strategy_at(hosts, len(workers))
        if name == current:
            return None
        rates = fn.rates(hosts, len(workers))
        if not rates.get(name, -math.inf) > rates.get(current, 0.0) * (1 + SWITCH_MARGIN):
            return None
        plans = {s.name: s for s in fn.plans(allocation_resources(fn.base, hosts, len(workers)))}
    except Exception:  # noqa: BLE001 - the cost model cannot say here: it keeps what it runs
        return None
    return plans.get(name)


def plan_as(chosen: Any, profile: Any, cluster: Any, batch: Any) -> Callable[[list[str]], Any]:
    """``workers -> Strategy``: ``chosen``'s builder and options built for those workers at the run's
    batch settings (a re-allocation's resume, and any later re-plan after a lost worker)."""
    from distlab import strategy as strategies

    def plan(workers: list[str]) -> Any:
        res = cluster.resources.of_workers(list(workers))
        return dataclasses.replace(
            strategies.build(chosen.builder, profile, res, **chosen.options), batch=batch
        )

    return plan


class RestartPricer:
    """A Lab's restart costs: the storage rates measured once (lazily, in its checkpoint folder),
    each run's checkpoint bytes and its measured relaunches."""

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = directory
        self.storage: tuple[float, float] | None = None

    def rates(self) -> tuple[float, float]:
        if self.storage is None:
            where = self.directory if self.directory is not None and Path(self.directory).is_dir() else None
            self.storage = measure_storage(where, STORAGE_PROBE_BYTES)
        return self.storage

    def nbytes(self, job: Any) -> int:
        """The run's newest checkpoint's size on disk, else what its profile says one holds."""
        path = job.run.checkpoint
        if path is not None and Path(path).is_file():
            return Path(path).stat().st_size
        if job.profile is None:
            return 0
        return checkpoint_bytes(job.profile, OPTIMIZER_STATES.get(job.optimizer or "adam", 2))

    def io_seconds(self, nbytes: float) -> float:
        write, read = self.rates()
        return nbytes / write + nbytes / read

    def settle(self, job: Any) -> None:
        """Turn a pending start or resume into a measured (re)launch once its first step arrived."""
        if job.pending is None:
            return
        since, before, resumed = job.pending
        m = job.run.metrics
        if len(m) == 0 or "restart" not in m:
            return
        new = m[(m["rank"] == 0) & (m["restart"] > before)]
        if len(new) == 0:
            return
        first = float(new["wall_time"].min())
        seconds = max(first - since, 0.0)
        if resumed:
            job.relaunches.append(max(seconds - self.io_seconds(self.nbytes(job)), 0.0))
        else:
            job.start_s = seconds
        job.pending = None

    def mark(self, job: Any, resumed: bool) -> None:
        """A start or a pause begins now: the next segment's first step ends its (re)launch."""
        m = job.run.metrics
        before = int(m["restart"].max()) if len(m) and "restart" in m else -1
        job.pending = (time.time(), before, resumed)

    def cost(self, job: Any, others: Sequence[float]) -> float:
        """Seconds a restart costs ``job`` now (``others``: every run's measured relaunches)."""
        relaunch = estimate_relaunch(job.relaunches, job.start_s, others)
        return restart_seconds(self.nbytes(job), relaunch, *self.rates())
