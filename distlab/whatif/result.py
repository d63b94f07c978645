"""A traced run as a what-if tool (``run.whatif(...)``, ``dl.whatif.load(path).whatif(...)``):
the step graph replayed with one thing changed, beside the analytic model's prediction of the same.

``Trace.whatif`` returns a ``WhatIf``: ``step_time``, ``throughput``, ``breakdown`` (compute, comm,
optimizer, other), ``identity_step`` (the replay with nothing changed) and ``measured_step`` (the
run's median step), ``analytic`` (the cost model's ``Prediction`` of the same configuration when the
trace came with the model's profile, else None, with the reason in ``notes``), and
``timeline()``: the replayed steps drawn like ``run.timeline()``, the run's own beside them.
"""

from __future__ import annotations

import functools
import html
import math
import time
from dataclasses import dataclass, field
from typing import Any

from distlab.whatif.graph import StepGraph, build
from distlab.whatif.replay import Replayed, replay
from distlab.whatif.trace import TraceData
from distlab.whatif.transform import Change, apply


@dataclass
class WhatIf:
    """One what-if's replay (see the module's docstring)."""

    changes: dict[str, Any]
    replayed: Replayed
    identity_step: float
    measured_step: float
    analytic: Any = None
    notes: list[str] = field(default_factory=list)
    original: list[dict[str, Any]] = field(default_factory=list)  # the run's spans, for timeline()
    seconds: float = 0.0  # the replay's own time

    @property
    def step_time(self) -> float:
        return self.replayed.step_time

    @property
    def throughput(self) -> float:
        return self.replayed.graph.samples_per_step / self.step_time

    @functools.cached_property
    def breakdown(self) -> dict[str, float]:
        return self.replayed.breakdown()

    @property
    def difference(self) -> str:
        """The replay against the analytic model, in words ("" without an analytic prediction)."""
        return "" if self.analytic is None else self.versus(self.analytic)

    def versus(self, prediction: Any) -> str:
        """The replay against a ``Prediction``: the ratio of their steps and the part that differs most."""
        ratio = self.step_time / prediction.step_time
        theirs = prediction.breakdown
        part = max(self.breakdown, key=lambda k: abs(self.breakdown[k] - theirs.get(k, 0.0)))
        gap = (self.breakdown[part] - theirs.get(part, 0.0)) * 1e3
        return (
            f"replay {self.step_time * 1e3:.1f} ms vs analytic {prediction.step_time * 1e3:.1f} ms "
            f"({ratio:.2f}x); most of the difference in {part} ({gap:+.1f} ms)"
        )

    def timeline(self, steps: int = 3, ranks: int = 8) -> Any:
        """The replayed steps (``what-if`` rows) below the run's own last ``steps`` steps."""
        from distlab.notebook.timeline import spans_figure

        last = max((e["step"] for e in self.original), default=0)
        measured = [e for e in self.original if e["step"] > last - steps and e["rank"] < ranks]
        m0 = min((e["start"] for e in measured), default=0.0)
        shown = [dict(e, start=e["start"] - m0, end=e["end"] - m0) for e in measured]
        warm = self.replayed.warm
        first = self.replayed.ends[warm]
        extra = [
            dict(e, start=e["start"] - first, end=e["end"] - first, who=f"what-if rank {e['rank']}")
            for e in self.replayed.spans(ranks)
            if warm + 1 <= e["step"] <= warm + steps
        ]
        what = ", ".join(f"{k}={v}" for k, v in self.changes.items()) or "nothing changed"
        return spans_figure(
            shown + extra, f"what-if ({what}): replayed below the run's last {steps} step(s), ms"
        )

    def _repr_html_(self) -> str:
        what = ", ".join(f"{k}={v}" for k, v in self.changes.items()) or "nothing changed (identity)"
        b = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in self.breakdown.items())
        rows = [
            f"<b>what-if</b> {html.escape(what)}: step {self.step_time * 1e3:.2f} ms, "
            f"{self.throughput:,.0f} samples/s ({b} ms)",
            f"the run: {self.measured_step * 1e3:.2f} ms measured, "
            f"{self.identity_step * 1e3:.2f} ms replayed",
        ]
        if self.difference:
            rows.append(html.escape(self.difference))
        rows += [html.escape(n) for n in self.notes]
        return "<br>".join(rows)

    def __repr__(self) -> str:
        return (
            f"WhatIf(step_time={self.step_time:.5f}, throughput={self.throughput:.1f}, "
            f"changes={self.changes})"
        )


class Trace:
    """A traced run, ready to replay (``run.whatif`` builds one; ``dl.whatif.load`` from a file).

    ``cost_model`` prices communication the what-ifs change (default: ``CostModel.default()``);
    ``resources`` the cluster it was calibrated on; ``profile`` lets ``whatif`` rebuild the
    strategy at another world and put the analytic prediction beside the replay."""

    def __init__(
        self, data: TraceData, cost_model: Any = None, resources: Any = None, profile: Any = None
    ) -> None:
        self.data = data
        self.graph: StepGraph = build(data)
        self.cost_model, self.resources, self.profile = cost_model, resources, profile
        self._identity: Replayed | None = None

    @property
    def identity(self) -> Replayed:
        """The replay with nothing changed (it must reproduce the run: ``measured_step``)."""
        if self._identity is None:
            self._identity = replay(self.graph)
        return self._identity

    @property
    def measured_step(self) -> float:
        return self.graph.measured_step

    def identity_check(self) -> tuple[float, float]:
        """(replayed, measured): the identity replay's step (every step after the first, each
        with its own durations, the median of the replayed periods) beside the run's median step.
        It is exact wherever the graph accounts for every wait, so a miss is a join, a tail or a
        timestamp the graph gets wrong."""
        return self.identity.step_time, self.measured_step

    def whatif(
        self,
        *,
        bandwidth: float | None = None,
        latency: float | None = None,
        world: int | None = None,
        hosts: int | None = None,
        bucket_mb: float | None = None,
        overlap: bool | None = None,
        compute_scale: float | None = None,
        strategy: Any = None,
        cost_model: Any = None,
    ) -> WhatIf:
        """The trace replayed with the given changes (see the module's docstring); all None: identity."""
        t0 = time.perf_counter()
        cm = cost_model or self.cost_model or _default_model()
        st = self._strategy(strategy, world, hosts)
        change = Change(bandwidth, latency, world, hosts, bucket_mb, overlap, compute_scale, st)
        g, notes = apply(self.graph, change, cm, self.resources)
        out = replay(g)
        changes = {
            k: (v.name if k == "strategy" else v)
            for k, v in vars(change).items()
            if v is not None and not (k == "strategy" and strategy is None)
        }
        analytic, why = self._analytic(cm, change, g)
        if why:
            notes.append(f"analytic: {why}")
        notes = list(self.graph.notes) + notes
        return WhatIf(
            changes,
            out,
            self.identity.step_time,
            self.measured_step,
            analytic,
            notes,
            self.data.spans,
            time.perf_counter() - t0,
        )

    def _strategy(self, strategy: Any, world: int | None, hosts: int | None) -> Any:
        """A strategy object for ``strategy=`` (a builder's name needs the model's profile)."""
        if strategy is None or not isinstance(strategy, str):
            return strategy
        from distlab.whatif.trace import TraceError

        if self.profile is None:
            raise TraceError(
                f"whatif(strategy={strategy!r}): a builder's name needs the model's profile, which this "
                "trace lacks (a saved trace, or a run launched without a prediction): pass a Strategy "
                "(dl.strategy.build(name, profile, resources))"
            )
        from distlab.strategy import build as build_strategy

        return build_strategy(strategy, self.profile, self._resources(world or self.graph.world, hosts))

    def _resources(self, world: int, hosts: int | None) -> Any:
        """The trace's resources at ``world`` ranks on ``hosts`` hosts (as traced when None)."""
        n_hosts = hosts or min(self.graph.num_hosts, world)
        res = self.resources
        if res is None or (world == self.graph.world and n_hosts == self.graph.num_hosts):
            return res
        return res.with_world(world, per_host=math.ceil(world / n_hosts))

    def _analytic(self, cm: Any, change: Change, g: StepGraph) -> tuple[Any, str]:
        """The cost model's prediction of the same configuration, or why there is none."""
        if self.profile is None or self.resources is None or self.graph.strategy is None:
            return None, "no prediction beside the replay: the trace came without the model's profile"
        if missing := [
            k for k in ("bucket_mb", "overlap", "compute_scale") if getattr(change, k) is not None
        ]:
            return None, f"the analytic model has no knob for {', '.join(missing)}"
        try:
            res = self._resources(g.world, change.hosts)
            st = change.strategy
            if st is None:
                st = self.graph.strategy
                if g.world != self.graph.world or change.hosts is not None:
                    from distlab.strategy import build as build_strategy

                    st = build_strategy(st.builder, self.profile, res, **st.options)
            if change.bandwidth is not None or change.latency is not None:
                from distlab.costmodel.whatif import with_network

                if g.num_hosts < 2:
                    return (
                        None,
                        "a bandwidth what-if on one host changes no inter-host link of the analytic model",
                    )
                link = cm.links(res)["inter"]
                cm, res = with_network(
                    cm, res, change.latency or link.latency, change.bandwidth or link.bandwidth
                )
            return cm.predict(self.profile, res, st, optimizer=self.graph.optimizer), ""
        except Exception as e:  # noqa: BLE001 - the analytic figure is a companion, never a reason to fail
            return None, f"could not predict the same configuration ({e})"


def _default_model() -> Any:
    from distlab.costmodel.model import CostModel

    return CostModel.default()
