"""StrategyPicker: an ipywidgets + plotly widget to choose a strategy by its predicted throughput."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from distlab.errors import DistlabError

CHUNK_SIZES = (16, 32, 64, 128, 256, 512)
COMPRESSORS = ("none", "fp16", "bf16")
# The options a control drives, and the builder keyword it maps to.
OPTION_CONTROLS = ("chunk_size", "servers", "topology", "dynamic", "mode", "compressor")


def _builder_params(name: str) -> set[str]:
    """Keyword options the builder accepts (read from its signature)."""
    from distlab.strategy import builder_options

    return set(builder_options(name))


class StrategyPicker(w.VBox):
    """Choose a builder and its options; see predicted throughput, its breakdown and scaling.

    ``picker.value`` is the selected ``Strategy``; ``picker.save(path)`` writes it. The what-if
    sliders (workers, link bandwidth) change only the prediction, not the cluster. With a Lab,
    the Launch button runs the selected strategy and adds the measured point to the chart.
    """

    def __init__(self, profile: Any, lab_or_resources: Any, cost_model: Any = None, *, model: Any = None, top: int = 8) -> None:
        from distlab import strategy as st
        from distlab.costmodel import CostModel

        self.profile = profile
        self.lab = lab_or_resources if hasattr(lab_or_resources, "launch") else None
        self.base_resources = self.lab.resources if self.lab is not None else lab_or_resources
        if self.base_resources is None or not hasattr(self.base_resources, "ranks"):
            raise DistlabError("StrategyPicker: second argument must be a Lab or a ResourceSpec")
        self.cost_model = cost_model if cost_model is not None else CostModel.default()
        self.model = model
        if self.lab is not None and model is not None and hasattr(model, "named_parameters"):
            from distlab.launch.calibrate import measure_model_lab

            # with a cluster, the model's compute is its own step on the workers (cached)
            self.cost_model = measure_model_lab(self.lab, self.cost_model, model, batch_size=profile.batch_size)
        self.top = top
        self._busy = False
        self._ranked: Any = None
        self.runs: list[dict[str, Any]] = []
        world = self.base_resources.world
        names = list(st.builders())
        style = {"description_width": "110px"}

        self.builder = w.Dropdown(options=names, value="AllReduce" if "AllReduce" in names else names[0], description="builder", style=style)
        self.chunk_size = w.Dropdown(options=list(CHUNK_SIZES), value=128, description="chunk size", style=style)
        self.servers = w.Dropdown(options=[("first rank of each host", "first"), ("every rank", "all")], value="first", description="servers", style=style)
        from distlab import topology

        self.topology = w.Dropdown(options=list(topology.names()), value="exp2", description="topology", style=style)
        self.dynamic = w.Checkbox(value=False, description="dynamic topology", style=style)
        self.mode = w.ToggleButtons(options=["atc", "awc"], value="atc", description="gossip mode", style=style)
        self.compressor = w.Dropdown(options=list(COMPRESSORS), value="none", description="compressor", style=style)
        self.batch = w.BoundedIntText(value=profile.batch_size, min=1, max=1 << 16, description="batch/replica", style=style)
        self.workers = w.IntSlider(value=world, min=1, max=max(64, 4 * world), description="workers (what-if)", style=style)
        self.bandwidth = w.FloatLogSlider(value=1.0, base=10, min=-2, max=2, step=0.1, description="bandwidth x", style=style)
        self.table = w.Select(options=[], rows=top, description="top", layout=w.Layout(width="100%"), style=style)
        self.steps = w.BoundedIntText(value=50, min=1, max=1_000_000, description="steps", style=style)
        self.launch_button = w.Button(description="Launch", button_style="primary", disabled=self.lab is None, icon="play")
        self.status = w.HTML()

        self.figure = go.FigureWidget(make_subplots(rows=1, cols=2, subplot_titles=("predicted samples/s", "scaling (predicted)")))
        self.figure.update_layout(height=380, barmode="stack", margin={"l": 10, "r": 10, "t": 40, "b": 40}, legend={"orientation": "h"})
        for part, colour in (("compute", "#4c78a8"), ("comm", "#f58518"), ("optimizer", "#54a24b")):
            self.figure.add_bar(x=[], y=[], name=part, marker_color=colour, orientation="h", row=1, col=1)
        self.figure.add_scatter(x=[], y=[], mode="lines+markers", name="selected", row=1, col=2)
        self.figure.update_xaxes(title_text="step time (s)", row=1, col=1)
        self.figure.update_yaxes(autorange="reversed", automargin=True, row=1, col=1)
        self.figure.update_xaxes(title_text="workers", type="log", row=1, col=2)
        self.figure.update_yaxes(title_text="samples/s", row=1, col=2)
        self.measured = go.FigureWidget()
        self.measured.add_scatter(x=[], y=[], mode="markers+text", name="runs", textposition="top center")
        self.measured.update_layout(title="predicted vs measured (samples/s)", height=300, xaxis_title="predicted", yaxis_title="measured")

        controls = [self.builder, self.chunk_size, self.servers, self.topology, self.dynamic, self.mode, self.compressor, self.batch, self.workers, self.bandwidth]
        for c in controls:
            c.observe(self._on_change, names="value")
        self.table.observe(self._on_pick, names="value")
        self.launch_button.on_click(self._on_launch)
        left = w.VBox(controls, layout=w.Layout(width="380px"))
        right = w.VBox([self.table, w.HBox([self.steps, self.launch_button]), self.status])
        super().__init__([w.HBox([left, right]), self.figure, self.measured])
        self.add_class("distlab-picker")
        self.value: Any = None
        self.prediction: Any = None
        self._refresh(rank=True)

    # -- what the controls mean ---------------------------------------------------------------
    def resources(self) -> Any:
        """The what-if resources: the cluster's, at the slider's world size and bandwidth."""
        from distlab.resources import Link

        res = self.base_resources
        if self.workers.value != res.world:
            res = res.with_world(self.workers.value)
        if self.bandwidth.value != 1.0:
            k = self.bandwidth.value
            res = res.with_links(**{c: Link(link.latency, link.bandwidth * k) for c, link in res.links.items()})
        return res

    def options(self) -> dict[str, Any]:
        """The options the selected builder accepts, from the controls."""
        accepted = _builder_params(self.builder.value)
        opts: dict[str, Any] = {}
        for key in OPTION_CONTROLS:
            if key in accepted:
                opts[key] = getattr(self, key).value
        if "batch_size" in accepted:
            opts["batch_size"] = self.batch.value
        for c in OPTION_CONTROLS:
            getattr(self, c).disabled = c not in accepted
        return opts

    def _build(self, builder: str, res: Any, opts: dict[str, Any]) -> Any:
        from distlab import strategy as st

        return st.build(builder, self.profile, res, **opts)

    # -- updates ------------------------------------------------------------------------------
    def _refresh(self, rank: bool = False) -> None:
        res = self.resources()
        try:
            self.value = self._build(self.builder.value, res, self.options())
            self.prediction = self.cost_model.predict(self.profile, res, self.value)
        except DistlabError as exc:
            self.status.value = f"<span style='color:#b00'>{exc}</span>"
            return
        self.status.value = f"<b>{self.value.name}</b>: {self.prediction.throughput:,.0f} samples/s predicted"
        if rank or self._ranked is None:
            self._rank(res)
        self._draw(res)

    def _rank(self, res: Any) -> None:
        from distlab import strategy as st

        cands = st.candidates(self.profile, res)
        self._ranked = self.cost_model.rank(self.profile, res, cands).head(self.top).reset_index(drop=True)
        self._busy = True
        try:
            self.table.options = [(f"{r.throughput:>10,.0f}/s  {r.strategy}", i) for i, r in self._ranked.iterrows()]
            self.table.value = None
        finally:
            self._busy = False

    def _draw(self, res: Any) -> None:
        rows = [("selected: " + self.value.name, self.prediction.breakdown)]
        rows += [(str(r.strategy), {k: getattr(r, k) for k in ("compute", "comm", "optimizer")}) for r in self._ranked.itertuples()]
        labels = [name for name, _ in rows]
        worlds = sorted({1, 2, 4, 8, 16, 32, 64, res.world} | {self.workers.value})
        curve = []
        for n in worlds:
            r = res.with_world(n) if n != res.world else res
            try:
                curve.append(self.cost_model.predict(self.profile, r, self._build(self.builder.value, r, self.options())).throughput)
            except DistlabError:
                curve.append(None)
        with self.figure.batch_update():
            for trace, part in zip(self.figure.data[:3], ("compute", "comm", "optimizer")):
                trace.y = labels
                trace.x = [b[part] for _, b in rows]
            self.figure.data[3].x = worlds
            self.figure.data[3].y = curve

    def _on_change(self, change: dict[str, Any]) -> None:
        if self._busy:
            return
        rank = change.get("owner") in (self.workers, self.bandwidth)
        self._refresh(rank=rank)

    def _on_pick(self, change: dict[str, Any]) -> None:
        if self._busy or change["new"] is None:
            return
        row = self._ranked.iloc[change["new"]]
        strategy = row["plan"] if "plan" in row else None
        builder = row["builder"]
        opts = dict(getattr(strategy, "options", {}) or {})
        self._busy = True
        try:
            self.builder.value = builder
            for key in OPTION_CONTROLS:
                if key in opts and opts[key] in _options_of(getattr(self, key)):
                    getattr(self, key).value = opts[key]
            if "batch_size" in opts:
                self.batch.value = opts["batch_size"]
        finally:
            self._busy = False
        self._refresh()

    def _on_launch(self, _button: Any = None) -> Any:
        if self.lab is None:
            self.status.value = "no Lab: pass a Lab (not a ResourceSpec) to launch from the picker"
            return None
        if self.model is None:
            self.status.value = "no model: create the picker with model=... (or use %distlab pick VAR)"
            return None
        strategy = self._build(self.builder.value, self.lab.resources, self.options())
        predicted = self.cost_model.predict(self.profile, self.lab.resources, strategy).throughput
        self.status.value = f"running {strategy.name} for {self.steps.value} steps ..."
        self.launch_button.disabled = True
        try:
            run = self.lab.launch(self.model, strategy=strategy, steps=self.steps.value)
            run.wait()
        except DistlabError as exc:
            self.status.value = f"<span style='color:#b00'>launch failed: {exc}</span>"
            return None
        finally:
            self.launch_button.disabled = False
        measured = run.throughput
        self.runs.append({"strategy": strategy.name, "predicted_throughput": predicted, "measured_throughput": measured})
        with self.measured.batch_update():
            t = self.measured.data[0]
            t.x = [r["predicted_throughput"] for r in self.runs]
            t.y = [r["measured_throughput"] for r in self.runs]
            t.text = [r["strategy"] for r in self.runs]
        self.status.value = f"<b>{strategy.name}</b>: measured {measured:,.0f} samples/s, predicted {predicted:,.0f}"
        return run

    # -- the result ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        if self.value is None:
            raise DistlabError("StrategyPicker.save: no strategy is selected")
        return self.value.save(path)


def _options_of(widget: Any) -> list[Any]:
    opts = getattr(widget, "options", None)
    if opts is None:
        return [True, False]
    return [o[1] if isinstance(o, tuple) else o for o in opts]
