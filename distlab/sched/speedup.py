"""A job's speedup for any allocation and the best strategy there: cost model first, measured steps after.

Pollux starts a job at speedup = replicas and caps it at twice what it has profiled. Here the
speedup at ``(nodes, replicas)`` is the best throughput any candidate strategy reaches there
(``CostModel.rank`` over ``strategy.candidates`` for that many workers on that many hosts),
relative to the best on one worker, so the strategy is re-chosen for every allocation the policy
weighs. Once the job has measured steps, the strategy it ran is priced at every allocation by
distlab's step model fitted to them (``costmodel.fit``); its compute and the rest of its step
(exposed communication, optimizer) are compared with the cost model's, and each part's factor
corrects the same part of every other candidate (as ``CostModel.refit`` does per model), so the
choice moves towards strategies that communicate less when communication was under-predicted.
With fewer measured allocations than the fit needs (a small Lab's one or two worlds), every
candidate is scaled by the cost model's mean error on them, and the strategy that ran is priced at
its measured rate where it ran (as ``lab_pricing.measured_speedup`` does without a cost model).

Only synchronous plans are candidates unless ``staleness_cost`` is given: a stale PS's or
gossip's throughput is not progress per second until its convergence is measured
(``Lab.probe_staleness``), and a scheduler comparing jobs needs progress.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from distlab.errors import SchedulerError

if TYPE_CHECKING:
    from distlab.costmodel import CostModel
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec
    from distlab.strategy.types import Strategy

MEASURED = "measured"
PREDICTED = "cost model"
FIT_COLUMNS = ("num_nodes", "num_replicas", "local_bsz", "step_time")


@dataclass(frozen=True)
class StrategyChoice:
    """The best strategy at one allocation, and the throughput it gives (samples/s)."""

    nodes: int
    replicas: int
    strategy: str
    throughput: float
    basis: str
    """``"cost model"`` (predicted) or ``"measured"`` (the job's own steps, through its fitted step model)."""


def allocation_resources(base: ResourceSpec | None, nodes: int, replicas: int) -> ResourceSpec:
    """``replicas`` ranks dealt evenly over ``nodes`` hosts (the first hosts get one more), with
    ``base``'s links and cores per host: what a job allocated that way plans for."""
    from distlab.resources import RankSpec, ResourceSpec

    if not 1 <= nodes <= replicas:
        raise SchedulerError(
            f"an allocation of {replicas} replicas on {nodes} hosts; need 1 <= nodes <= replicas"
        )
    kind = "gpu" if base is not None and base.gpus else "cpu"
    cores = next(iter(base.cores.values()), None) if base is not None and base.cores else None
    ranks: list[RankSpec] = []
    for h in range(nodes):
        here = replicas // nodes + (h < replicas % nodes)
        ranks += [RankSpec(len(ranks) + k, f"host-{h}", f"{kind}:{k}") for k in range(here)]
    hosts = [f"host-{h}" for h in range(nodes)]
    return ResourceSpec(
        ranks=tuple(ranks),
        links=dict(base.links) if base is not None else ResourceSpec(ranks=()).links,
        cores={h: cores for h in hosts} if cores else {},
    )


def synchronous(plans: Sequence[Strategy]) -> list[Strategy]:
    """The plans whose steps make the progress synchronous SGD makes (no staleness, no gossip)."""
    return [s for s in plans if not s.stale and s.gossip is None and s.builder != "AdaptiveBatch"]


class StrategySpeedup:
    """``speedup(nodes, replicas)`` for one job (a ``JobSpec.speedup``) that also names the strategy.

    ``cm`` is the Lab's calibrated CostModel, ``profile`` the job's model profile (its batch is the
    per-replica batch), ``base`` the cluster's ResourceSpec (links, cores per host). ``candidates``
    builds the plans for a ResourceSpec (default: ``strategy.candidates`` less the ones whose
    convergence is not counted); ``measured`` is the job's steps so far (``with_measurements``).
    """

    def __init__(
        self,
        cm: CostModel,
        profile: ModelProfile,
        base: ResourceSpec | None = None,
        *,
        candidates: Callable[[ModelProfile, ResourceSpec], Sequence[Strategy]] | None = None,
        noise_scale: float | None = None,
        optimizer: str | None = None,
        staleness_cost: Mapping[Any, float] | None = None,
        measured: Any = None,
    ) -> None:
        self.cm, self.profile, self.base = cm, profile, base
        self.noise_scale, self.optimizer, self.staleness_cost = noise_scale, optimizer, staleness_cost
        self._candidates = candidates
        self.measured = _measured_table(measured)
        self._fit = _fit(self.measured)
        self._memo: dict[tuple[int, int], StrategyChoice] = {}
        self._tables: dict[tuple[int, int], dict[str, np.ndarray]] = {}

    def with_measurements(self, rows: Any) -> StrategySpeedup:
        """This job's speedup refitted to its measured steps: a table (or list of dicts) with
        ``strategy``, ``num_nodes``, ``num_replicas``, ``local_bsz`` and ``step_time`` (s)."""
        out = StrategySpeedup(
            self.cm,
            self.profile,
            self.base,
            candidates=self._candidates,
            noise_scale=self.noise_scale,
            optimizer=self.optimizer,
            staleness_cost=self.staleness_cost,
            measured=rows,
        )
        out._tables = self._tables  # the cost model's figures do not depend on the measurements
        return out

    def plans(self, resources: ResourceSpec) -> list[Strategy]:
        """The candidate strategies for one allocation's resources."""
        if self._candidates is not None:
            return list(self._candidates(self.profile, resources))
        from distlab.strategy.candidates import candidates

        every = candidates(self.profile, resources)
        return every if self.staleness_cost is not None else synchronous(every)

    def choose(self, nodes: int, replicas: int) -> StrategyChoice:
        """The best strategy at ``replicas`` workers on ``nodes`` hosts (memoised)."""
        key = (int(nodes), int(replicas))
        if key not in self._memo:
            self._memo[key] = self._choose(*key)
        return self._memo[key]

    def strategy_at(self, nodes: int, replicas: int) -> str:
        """The name of the strategy the job would run at this allocation."""
        return self.choose(nodes, replicas).strategy

    def __call__(self, nodes: np.ndarray, replicas: np.ndarray) -> np.ndarray:
        base = self.choose(1, 1).throughput
        pairs = zip(
            np.asarray(nodes, dtype=int).ravel().tolist(), np.asarray(replicas, dtype=int).ravel().tolist()
        )
        out = [self.choose(max(1, min(n, r)), r).throughput / base if r > 0 else 0.0 for n, r in pairs]
        return np.asarray(out, dtype=float).reshape(np.shape(replicas))

    def _table(self, nodes: int, replicas: int) -> dict[str, np.ndarray]:
        """The cost model's figures for every candidate at this allocation: strategy, rate (goodput
        with a noise scale, else throughput), step_time and compute (s)."""
        key = (int(nodes), int(replicas))
        if key in self._tables:
            return self._tables[key]
        resources = allocation_resources(self.base, nodes, replicas)
        plans = self.plans(resources)
        if not plans:
            raise SchedulerError(
                f"no candidate strategy for {replicas} workers on {nodes} hosts; pass candidates= that "
                "builds at least one plan"
            )
        table = self.cm.rank(
            self.profile,
            resources,
            plans,
            noise_scale=self.noise_scale,
            optimizer=self.optimizer,
            staleness_cost=self.staleness_cost,
        )
        rate = "goodput" if "goodput" in table else "throughput"
        out = {
            "strategy": np.asarray([str(n) for n in table["strategy"]], dtype=object),
            "rate": np.asarray(table[rate], dtype=float),
            "step_time": np.asarray(table["step_time"], dtype=float),
            "compute": np.asarray(table["compute"], dtype=float),
        }
        self._tables[key] = out
        return out

    def rates(self, nodes: int, replicas: int) -> dict[str, float]:
        """Every candidate's rate (samples/s, or goodput with a noise scale) at this allocation,
        with the job's measurements applied."""
        names, rate, _ = self._priced(nodes, replicas)
        return dict(zip(names, rate.tolist()))

    def _choose(self, nodes: int, replicas: int) -> StrategyChoice:
        names, rate, basis = self._priced(nodes, replicas)
        ok = np.isfinite(rate)
        if not ok.any():
            raise SchedulerError(f"no priced strategy for {replicas} workers on {nodes} hosts")
        i = int(np.flatnonzero(ok)[np.argmax(rate[ok])])
        return StrategyChoice(nodes, replicas, names[i], float(rate[i]), str(basis[i]))

    def _priced(self, nodes: int, replicas: int) -> tuple[list[str], np.ndarray, np.ndarray]:
        t = self._table(nodes, replicas)
        rate = t["rate"].copy()
        basis = np.full(len(rate), PREDICTED, dtype=object)
        if self._fit is not None:
            ran, theta = self._fit
            mine = np.flatnonzero(t["strategy"] == ran)
            if theta is None:  # too few steps for the structure: the cost model's mean error on them,
                rate = rate * self._mean_ratio(ran)
                seen = self._measured_rate(ran, nodes, replicas) if len(mine) else None
                if seen is not None and self.noise_scale is None and self.staleness_cost is None:
                    # and, where it ran, its measured rate (samples/s: not a goodput)
                    rate[mine[0]] = seen
            elif len(mine):
                step = _corrected_steps(
                    t, int(mine[0]), theta, nodes, replicas, float(self.profile.batch_size)
                )
                # samples per step are unchanged: the rate scales inversely with the step
                rate = rate * t["step_time"] / step
            basis[mine] = MEASURED
        return [str(n) for n in t["strategy"]], rate, basis

    def _measured_rate(self, ran: str, nodes: int, replicas: int) -> float | None:
        """Samples/s ``ran`` measured at this allocation (the mean of its rows there), or None."""
        df = self.measured
        here = df[(df["strategy"] == ran) & (df["num_nodes"] == nodes) & (df["num_replicas"] == replicas)]
        if not len(here):
            return None
        return float((here["num_replicas"] * here["local_bsz"] / here["step_time"]).mean())

    def _mean_ratio(self, ran: str) -> float:
        """Measured over predicted throughput of ``ran``, averaged over the measured rows."""
        ratios = []
        for row in self.measured[self.measured["strategy"] == ran].to_dict("records"):
            n, r = int(row["num_nodes"]), int(row["num_replicas"])
            t = self._table(n, r)
            mine = np.flatnonzero(t["strategy"] == ran)
            if len(mine) and t["step_time"][mine[0]] > 0:
                ratios.append(float(t["step_time"][mine[0]]) / float(row["step_time"]))
        return float(np.mean(ratios)) if ratios else 1.0


def _corrected_steps(
    t: dict[str, np.ndarray], ran: int, theta: dict[str, float], nodes: int, replicas: int, batch: float
) -> np.ndarray:
    """Every candidate's step with the measured strategy's errors carried over: the fitted step
    model splits the ran strategy's step into compute (its step on one replica) and the rest
    (exposed communication and optimizer); each part's measured/predicted factor multiplies the
    same part of every candidate (as ``CostModel.refit``'s compute and comm factors do), so a
    strategy that communicates less gains when communication was under-predicted."""
    from distlab.costmodel.refit import BOUNDS

    fitted = _predict(theta, nodes, replicas, batch)
    fitted_compute = min(_predict(theta, 1, 1, batch), fitted)
    compute, rest = t["compute"], t["step_time"] - t["compute"]
    k_compute = np.clip(fitted_compute / compute[ran], *BOUNDS) if compute[ran] > 0 else 1.0
    k_rest = np.clip((fitted - fitted_compute) / rest[ran], *BOUNDS) if rest[ran] > 0 else 1.0
    step = compute * k_compute + np.maximum(rest, 0.0) * k_rest
    step[ran] = fitted  # the strategy that ran: its own fitted step
    return step


def _measured_table(rows: Any) -> Any:
    if rows is None:
        return None
    import pandas as pd

    df = pd.DataFrame(rows)
    missing = [c for c in ("strategy", *FIT_COLUMNS) if c not in df.columns]
    if missing:
        raise SchedulerError(
            f"measured steps: missing columns {missing}; give strategy, num_nodes, num_replicas, "
            "local_bsz and step_time (s) per row"
        )
    return df


def _fit(df: Any) -> tuple[str, dict[str, float] | None] | None:
    """The strategy the job ran most, and distlab's step model fitted to its rows (None: too few)."""
    if df is None or not len(df):
        return None
    from distlab.costmodel.fit import fit_measurements

    ran = str(df["strategy"].mode().iloc[0])
    rows = df[df["strategy"] == ran]
    if len(rows) >= 3:
        _, theta, _ = fit_measurements(rows[list(FIT_COLUMNS)])
        return ran, theta
    return ran, None


def _predict(theta: dict[str, float], nodes: int, replicas: int, batch: float) -> float:
    import pandas as pd

    from distlab.costmodel.fit import predict_measurements

    row = pd.DataFrame({"num_nodes": [nodes], "num_replicas": [replicas], "local_bsz": [batch]})
    return float(predict_measurements(theta, row)[0])
