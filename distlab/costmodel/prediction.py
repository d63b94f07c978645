"""Prediction: one strategy's predicted step time, its breakdown and throughput (and goodput), rendered in a
notebook."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

#: where a prediction's compute came from: the model's own step measured on the cluster's workers
#: (``Lab.measure_model``, which ``lab.launch``, the picker and ``%distlab simulate`` call), or
#: its profile scaled by the calibrated compute model
MEASURED_STEP, PROFILE = "measured step", "profile"

#: the mean absolute error of each basis on models no calibration, default or test was fitted to
#: (``distlab bench prediction-paths``; the figures and their date in
#: datasets/measurements/prediction-paths.md, which a test compares with these)
BASIS_ERROR: dict[str, float] = {MEASURED_STEP: 0.13, PROFILE: 0.2}


@dataclass(frozen=True)
class Prediction:
    """Predicted step of one strategy.

    ``breakdown`` has ``compute`` (forward + backward, contention included), ``comm`` (the
    communication backward does not hide) and ``optimizer``; they add up to ``step_time``.
    ``throughput`` is samples per second over all replicas; ``goodput`` is throughput times
    statistical efficiency, present when a gradient noise scale was given (Pollux/AdaptDL).
    ``detail`` splits comm by where the runtime spends it: ``backward`` (all-reduce buckets and
    PS reduces that backward does not hide; ``backward_total`` before overlap), ``sparse``
    (sparse gathers after backward), ``broadcast`` (servers' new values after the step),
    ``gossip`` (neighbour averaging, exposed part) and ``calls`` (the runtime's own work around
    each collective call).
    """

    strategy: str
    world: int
    global_batch: int
    step_time: float
    throughput: float
    breakdown: dict[str, float]
    detail: dict[str, float] = field(default_factory=dict)
    goodput: float | None = None
    efficiency: float | None = None
    basis: str = PROFILE
    notes: tuple[str, ...] = ()

    @property
    def uncertainty(self) -> float | None:
        """The typical relative error of predictions of this basis (``BASIS_ERROR``)."""
        return BASIS_ERROR.get(self.basis)

    @property
    def total(self) -> float:
        """Step time in seconds (the sum of the breakdown)."""
        return self.step_time

    def summary(self) -> str:
        b = self.breakdown
        text = (
            f"{self.strategy} on {self.world} ranks: {self.throughput:,.1f} samples/s, step "
            f"{self.step_time * 1e3:.2f} ms "
            f"(compute {b['compute'] * 1e3:.2f}, comm {b['comm'] * 1e3:.2f}, optimizer "
            f"{b['optimizer'] * 1e3:.2f} ms)"
        )
        if self.goodput is not None:
            text += f", goodput {self.goodput:,.1f} (efficiency {self.efficiency:.2f})"
        return text + f"; {self.basis_text()}" + "".join(f"; {n}" for n in self.notes)

    def basis_text(self) -> str:
        """``from the measured step, typically within 10%``: what the figure rests on, in words."""
        err = self.uncertainty
        return f"from the {self.basis}" + (f", typically within {err:.0%}" if err is not None else "")

    def __repr__(self) -> str:
        return f"<Prediction {self.summary()}>"

    def _repr_html_(self) -> str:
        total = self.step_time or 1.0
        colours = {"compute": "#4c78a8", "comm": "#e45756", "optimizer": "#72b7b2"}
        bar = "".join(
            f'<div title="{k} {v * 1e3:.2f} ms" style="display:inline-block;height:12px;'
            f'width:{max(v / total * 100, 0):.2f}%;background:{colours[k]}"></div>'
            for k, v in self.breakdown.items()
            if k in colours
        )
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td style='text-align:right'>{v * 1e3:.3f} ms</td></tr>"
            for k, v in [*self.breakdown.items(), *((f"  {k}", v) for k, v in self.detail.items())]
        )
        return (
            f"<div><b>{html.escape(self.summary())}</b>"
            f"<div style='width:320px;border:1px solid #ccc;margin:4px 0'>{bar}</div>"
            f"<table>{rows}</table></div>"
        )
