"""StrategyPicker: an ipywidgets + plotly widget to choose a strategy by its predicted throughput.

Long because the picker is one widget whose controls, callbacks and launch share its state; its charts are
in picker_charts.py and its launch thread in picker_launch.py."""

from __future__ import annotations

import contextlib
import html
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ipywidgets as w

from distlab.errors import DistlabError
from distlab.notebook.figures import FigureView
from distlab.notebook.picker_launch import PickerLaunch, closed_text, workers_of
from distlab.notebook.picker_options import (
    GOSSIP_MODE_CHOICES,
    consistency_control,
    options_from,
    show_options,
)
from distlab.notebook.ranking import short_label
from distlab.strategy.types import COMPRESSORS

CHUNK_SIZES = (16, 32, 64, 128, 256, 512)
RED = "<span style='color:#b00'>{}</span>"


class StrategyPicker(PickerLaunch, w.VBox):
    """Choose a builder and its options; see predicted throughput, its breakdown and scaling.

    ``picker.value`` is the selected ``Strategy``; ``picker.save(path)`` writes it. The what-if controls
    change only the prediction, not the cluster: ``hosts`` like the cluster's first one (its cores kept),
    ``per_host`` ranks (devices) on each, and the ``network`` between hosts (a preset, or
    ``net_bandwidth`` Gb/s and ``net_latency`` µs of one link). ``trace=`` (a traced run or
    ``dl.whatif.load(path)``): the plan line shows it replayed with the plan beside the prediction. With a
    Lab, predictions come from ``lab.cost_model`` (the model's own step measured on the workers), and the
    Launch button runs the selected strategy in the background on the first ``picker.world`` workers of
    the cluster (all of them when the what-if asks for more), on ``data`` under ``loss`` (synthetic data
    from the profile's input when no data is given), shows its steps, and adds the measured point against
    the Lab's prediction to the chart; ``picker.wait()`` waits for it.

    Adaptive strategies (AdaptiveBatch) also show goodput: the configuration their controller
    would choose at the gradient noise scale in the "noise scale" box (``noise_scale=``, or
    "measure" on the model's data: ``distlab.runtime.noise_probe.measure_noise_scale``). Stale and
    asynchronous PS plans (the "consistency" control) are priced at their consistency, asynchronous
    gossip (the gossip mode's "(async)" choices) at each rank's own pace; ``staleness_cost=`` (g per
    staleness, ``lab.probe_staleness``) ranks the list by goodput = throughput / g(s) (docs/consistency.md).
    Without it, those plans' rows and plan line say "convergence not counted: lab.probe_staleness";
    with it, a staleness it does not price is listed after the priced plans, its note saying so.
    """

    def __init__(
        self,
        profile: Any,
        lab_or_resources: Any,
        cost_model: Any = None,
        *,
        model: Any = None,
        data: Any = None,
        loss: Any = None,
        noise_scale: float | None = None,
        top: int = 8,
        trace: Any = None,
        staleness_cost: Any = None,
    ) -> None:
        from distlab.costmodel import CostModel

        self.profile = profile
        self.lab = lab_or_resources if hasattr(lab_or_resources, "launch") else None
        self.base_resources = self.lab.resources if self.lab is not None else lab_or_resources
        if self.base_resources is None or not hasattr(self.base_resources, "ranks"):
            raise DistlabError("StrategyPicker: second argument must be a Lab or a ResourceSpec")
        self.cost_model = cost_model if cost_model is not None else CostModel.default()
        self.model = model
        self.data, self.loss = data, loss
        if self.lab is not None and model is not None and hasattr(model, "named_parameters"):
            # predict with what lab.launch predicts with (and lab.runs records): the Lab's cost model
            # with the model's own step measured on the workers (cached)
            if self.lab.cost_model is None:
                self.lab.cost_model = self.cost_model
            self.lab.measure_model(model, batch_size=profile.batch_size)
        self.top, self.staleness_cost = top, staleness_cost
        self.trace = trace  # a traced Run or a distlab.whatif.Trace: its replay beside each prediction
        self._busy = False
        self._ranked: Any = None
        self._cm: Any = None  # the cost model of what the picker shows now
        self._lock = threading.RLock()  # callbacks run on the kernel's thread and the run's threads
        self._in_flight = False
        self._plan_line = self._run_line = self._error_line = ""  # the status, top to bottom: error first
        self.runs: list[dict[str, Any]] = []
        self.launch_thread: threading.Thread | None = None
        self.last_run: Any = None
        self.log_path: Path | None = None
        style = {"description_width": "120px"}
        self._make_strategy_controls(profile, style)
        self._make_what_if_controls(self.base_resources, style)
        self._make_run_controls(noise_scale, model, data, top, style)
        from distlab.notebook.picker_charts import measured_figure, plan_figure

        self.view, self.measured_view = FigureView(plan_figure()), FigureView(measured_figure())
        self.figure, self.measured = self.view.figure, self.measured_view.figure
        self._arrange()
        self.add_class("distlab-picker")
        self.value: Any = None
        self.prediction: Any = None
        self.noise_measurement: Any = None
        with self._reporting("planning"):
            self._refresh(rank=True)

    # -- construction: the controls and their layout ------------------------------------------
    def _make_strategy_controls(self, profile: Any, style: dict[str, str]) -> None:
        """The builder and its options, and the per-replica batch."""
        from distlab import strategy as st

        names = list(st.builders())
        self.builder = w.Dropdown(
            options=names,
            value="AllReduce" if "AllReduce" in names else names[0],
            description="builder",
            style=style,
        )
        self.chunk_size = w.Dropdown(
            options=list(CHUNK_SIZES), value=128, description="chunk size", style=style
        )
        self.servers = w.Dropdown(
            options=[("first rank of each host", "first"), ("every rank", "all")],
            value="first",
            description="servers",
            style=style,
        )
        from distlab import topology

        self.topology = w.Dropdown(
            options=list(topology.names()), value="exp2", description="topology", style=style
        )
        self.dynamic = w.Checkbox(value=False, description="dynamic topology", style=style)
        self.mode = w.Dropdown(
            options=GOSSIP_MODE_CHOICES, value="atc", description="gossip mode", style=style
        )
        self.compressor = w.Dropdown(
            options=list(COMPRESSORS), value="none", description="compressor", style=style
        )
        self.consistency = consistency_control(style)
        self.batch = w.BoundedIntText(
            value=profile.batch_size, min=1, max=1 << 16, description="batch/replica", style=style
        )

    def _make_what_if_controls(self, base: Any, style: dict[str, str]) -> None:
        """Hosts like this one, ranks (GPUs) per host and the network between hosts."""
        from distlab.costmodel.whatif import NETWORKS

        self._base_shape = (
            max(base.num_hosts, 1),
            max((len(base.ranks_on(h)) for h in base.hosts), default=1),
        )
        self.hosts = w.BoundedIntText(
            value=self._base_shape[0], min=1, max=4096, description="hosts like this", style=style
        )
        self.per_host = w.BoundedIntText(
            value=self._base_shape[1],
            min=1,
            max=1024,
            description="GPUs per host" if base.gpus else "ranks per host",
            style=style,
        )
        inter = self.current_cost_model().links(base)["inter"]
        self._calibrated_link = (inter.latency, inter.bandwidth)
        self.network = w.Dropdown(
            options=[*NETWORKS, "custom"], value="as calibrated", description="network", style=style
        )
        # a what-if outside the model's domain (no hosts, no bandwidth) cannot be typed: the bounds refuse it
        self.net_bandwidth = w.BoundedFloatText(
            value=round(inter.bandwidth * 8 / 1e9, 3),
            min=0.001,
            max=1e5,
            description="link Gb/s",
            style=style,
        )
        self.net_latency = w.BoundedFloatText(
            value=round(inter.latency * 1e6, 2), min=0.01, max=1e6, description="latency µs", style=style
        )

    def _make_run_controls(
        self, noise_scale: float | None, model: Any, data: Any, top: int, style: dict[str, str]
    ) -> None:
        """The noise scale and its measure button, the ranked list, the steps and Launch."""
        self.noise_scale = w.BoundedFloatText(
            value=float(noise_scale or 0.0),
            min=0.0,
            max=1e12,
            description="noise scale φ",
            style=style,
            layout=w.Layout(width="270px"),
        )
        self.measure_button = w.Button(
            description="measure φ",
            disabled=model is None or data is None,
            tooltip="the gradient noise scale of the model on its data (needs model= and data=)",
            layout=w.Layout(width="100px"),
        )
        self.table = w.Select(
            options=[], rows=top, description="top", layout=w.Layout(width="100%"), style=style
        )
        self.note = w.HTML()
        self.steps = w.BoundedIntText(value=50, min=1, max=1_000_000, description="steps", style=style)
        self.launch_button = w.Button(
            description="Launch", button_style="primary", disabled=self.lab is None, icon="play"
        )
        self.status = w.HTML()

    def _arrange(self) -> None:
        """Observe every control and lay the picker out: controls left, the list right, charts below."""
        controls = [self.builder, self.chunk_size, self.servers, self.topology, self.dynamic, self.mode]
        controls += [self.compressor, self.consistency, self.batch]
        what_if = [self.hosts, self.per_host, self.network, self.net_bandwidth, self.net_latency]
        for c in (*controls, *what_if):
            c.observe(self._on_change, names="value")
        self.noise_scale.observe(self._on_noise, names="value")
        self.measure_button.on_click(self._on_measure)
        controls = [
            *controls,
            w.HBox([self.noise_scale, self.measure_button]),
            w.HTML("<b>what if</b>"),
            *what_if,
        ]
        self.table.observe(self._on_pick, names="value")
        self.launch_button.on_click(self._on_launch)
        left = w.VBox(controls, layout=w.Layout(width="390px", flex="0 0 390px"))
        right = w.VBox(
            [self.table, self.note, w.HBox([self.steps, self.launch_button]), self.status],
            layout=w.Layout(flex="1 1 auto", min_width="300px"),
        )
        super().__init__(
            [
                w.HBox([left, right], layout=w.Layout(flex_flow="row wrap")),
                self.view.widget,
                self.measured_view.widget,
            ]
        )

    # -- what the controls mean ---------------------------------------------------------------
    @property
    def world(self) -> int:
        """Ranks of the what-if: hosts x ranks per host."""
        return int(self.hosts.value) * int(self.per_host.value)

    def resources(self) -> Any:
        """The what-if resources: ``hosts`` like the cluster's first, ``per_host`` ranks each, and
        the network chosen between them (the cluster itself when the what-if is the cluster)."""
        from distlab.costmodel.whatif import hosts_like

        res = hosts_like(self.base_resources, int(self.hosts.value), int(self.per_host.value))
        link = self._network()
        return res if link is None else res.with_links(inter=link)

    def _network(self) -> Any:
        """The inter-host link the what-if asks for; None: the cost model's own."""
        from distlab.resources import Link

        if self.network.value == "as calibrated":
            return None
        return Link(float(self.net_latency.value) * 1e-6, float(self.net_bandwidth.value) * 1e9 / 8)

    def _what_if_model(self, cm: Any) -> Any:
        """``cm`` with the network of the what-if between hosts (cached per model and link)."""
        from distlab.costmodel.whatif import with_network

        link = self._network()
        if link is None:
            return cm
        key = (id(cm), link.latency, link.bandwidth)
        if getattr(self, "_net_cache", (None,))[0] != key:
            self._net_cache = (
                key,
                with_network(cm, self.base_resources, link.latency, link.bandwidth)[0],
                cm,
            )
        return self._net_cache[1]

    def set_world(self, n: int) -> None:
        """The what-if of ``n`` ranks on hosts like the cluster's: the cluster's own shape when
        ``n`` is its size, else as many hosts as ``n`` needs at the cluster's ranks per host."""
        hosts, per = self._base_shape
        if n != hosts * per:
            hosts, per = -(-n // per), min(n, per)
            if hosts * per != n:
                hosts, per = n, 1
        self.hosts.value, self.per_host.value = hosts, per

    def options(self) -> dict[str, Any]:
        """The options the selected builder accepts, from the controls (picker_options.py)."""
        return options_from(self)

    @property
    def shown_cost_model(self) -> Any:
        """The cost model of what the picker shows now (None before its first drawing)."""
        return self._cm

    def current_cost_model(self) -> Any:
        """What predictions use: the Lab's cost model (what ``lab.launch`` predicts with and
        ``lab.runs`` records) when it has one, else the one passed in (or the default)."""
        lab_cm = getattr(self.lab, "cost_model", None)
        return lab_cm if lab_cm is not None else self.cost_model

    def _build(self, builder: str, res: Any, opts: dict[str, Any]) -> Any:
        from distlab import strategy as st

        return st.build(builder, self.profile, res, **opts)

    # -- updates ------------------------------------------------------------------------------
    def _refresh(self, rank: bool = False) -> None:
        with self._lock:
            res = self.resources()
            self._cm = self._what_if_model(self.current_cost_model())
            self.value = self._build(self.builder.value, res, self.options())
            self.prediction = p = self._cm.predict(self.profile, res, self.value)
            self._plan_line = (
                (
                    f"<b>{html.escape(self.value.name)}</b>: {p.throughput:,.0f} samples/s predicted, "
                    f"step {p.step_time * 1e3:,.1f} ms on {workers_of(res.world)}{self._where(res)}"
                    f" <span style='color:#888'>({html.escape(p.basis_text())})</span>"
                    + "".join(f"<br><span style='color:#b35900'>{html.escape(n)}</span>" for n in p.notes)
                )
                + self._goodput_line(self.value, res)
                + self._convergence_line()
                + self._replay_line(res)
            )
            if rank or self._ranked is None:
                self._rank(res)
            self._draw(res)
            self._error_line = ""
            self._show()

    def _replay_line(self, res: Any) -> str:
        """The traced run (``trace=``) replayed with this plan, for the plan line."""
        from distlab.whatif import replay_clause

        cm, net = self.current_cost_model(), self._network()
        self.trace, line = replay_clause(self.trace, cm, self.value, res, self.prediction, net)
        return line

    def _where(self, res: Any) -> str:
        """ " on 4 hosts like this one (25 Gb/s Ethernet)": the what-if, when it is not the cluster."""
        if res is self.base_resources:
            return ""
        net = "" if res.num_hosts < 2 else f", {self.network.value} between them"
        return f" ({res.num_hosts} host{'s' if res.num_hosts > 1 else ''} like this one{net})"

    def _rank(self, res: Any) -> None:
        import pandas as pd

        from distlab import strategy as st
        from distlab.notebook.ranking import SINGLE_PROCESS, ranking

        table = ranking(self._cm, self.profile, res, st.candidates(self.profile, res), self.staleness_cost)
        # the cost model's notes are on the plan line; what the list's order leaves out is said here
        uncounted = [n for n in table.attrs.get("notes", ()) if n.startswith("convergence not counted")]
        note = "; ".join(n for n in (table.attrs.get("single_note", ""), *uncounted) if n)
        head = table.head(self.top)
        single = table[table["strategy"] == SINGLE_PROCESS]
        if not (head["strategy"] == SINGLE_PROCESS).any():  # the baseline every plan must beat stays listed
            head = pd.concat([table.head(max(self.top - 1, 1)), single])
        self._ranked = head.reset_index(drop=True)
        self.note.value = html.escape(note)
        self._label_rows(res)
        self.table.value = None

    def _label_rows(self, res: Any) -> None:
        """The ranking's rows as the list shows them: throughput and step time, and for an adaptive
        strategy, when a noise scale is set, the goodput of the configuration it would choose."""
        rows = []
        for i, r in self._ranked.iterrows():
            text = f"{r.throughput:>10,.0f}/s {r.step_time * 1e3:>8,.1f} ms  {r.strategy}"
            f = self._forecast(r.plan, res)
            if f is not None:
                text += f"  (goodput {f.goodput:,.0f}/s at global batch {f.global_batch})"
            elif self.staleness_cost and r.get("goodput") == r.get("goodput"):
                text += f"  (goodput {r.goodput:,.0f}/s)"
            note = r.get("note")
            if isinstance(note, str) and note:  # what its figure leaves out: a staleness's convergence
                text += f"  [{note}]"
            rows.append((text, i))
        self._busy = True
        try:
            value = self.table.value
            self.table.options = rows
            self.table.value = value if value is not None and value < len(rows) else None
        finally:
            self._busy = False

    def _forecast(self, plan: Any, res: Any) -> Any:
        """An adaptive plan's goodput forecast at the noise scale set; None without one (or for a
        fixed batch)."""
        from distlab.runs.adaptive import adaptive_forecast

        phi = float(self.noise_scale.value or 0.0)
        if phi <= 0 or getattr(plan, "builder", None) != "AdaptiveBatch":
            return None
        return adaptive_forecast(
            self._cm, self.profile, res.with_world(plan.world) if plan.world != res.world else res, plan, phi
        )

    def _goodput_line(self, strategy: Any, res: Any) -> str:
        """The plan line's goodput clause for an adaptive strategy ("" for a fixed batch)."""
        if strategy.builder != "AdaptiveBatch":
            return ""
        f = self._forecast(strategy, res)
        if f is None:
            return (
                "<br>goodput: set the noise scale φ (or measure it on the model's data) to see the batch "
                "the controller would choose and its goodput"
            )
        return (
            f"<br>goodput <b>{f.goodput:,.0f}</b> samples/s at φ = {f.noise_scale:,.4g}: the controller "
            f"would train {f.per_replica} per replica x {f.accumulation} micro-batch(es) (global batch "
            f"{f.global_batch}) at {f.throughput:,.0f} samples/s, statistical efficiency {f.efficiency:.2f}"
        )

    def _convergence_line(self) -> str:
        """The plan line's note when the selected plan's convergence is not counted (a stale or
        asynchronous plan without its g) or its g was read as 1 (consistency.counted_g)."""
        from distlab.costmodel.convergence import counted_g

        note = counted_g(self.value, self.staleness_cost)[1]
        return f"<br><span style='color:#b35900'>{html.escape(note)}</span>" if note else ""

    def _draw(self, res: Any) -> None:
        from distlab.costmodel.whatif import hosts_like
        from distlab.notebook.picker_charts import HOSTS, draw_plan

        rows = [(short_label("selected: " + self.value.name), self.prediction.breakdown)]
        rows += [
            (short_label(str(r.strategy)), {k: getattr(r, k) for k in ("compute", "comm", "optimizer")})
            for r in self._ranked.itertuples()
        ]
        here, per = int(self.hosts.value), int(self.per_host.value)
        hosts = sorted(set(HOSTS) | {here})
        link = self._network()
        curve = []
        for n in hosts:
            r = hosts_like(self.base_resources, n, per)
            r = r if link is None else r.with_links(inter=link)
            try:
                curve.append(
                    self._cm.predict(
                        self.profile, r, self._build(self.builder.value, r, self.options())
                    ).throughput
                )
            except DistlabError:
                curve.append(None)
        bottleneck = next((n for n in self.prediction.notes if n.startswith("bottleneck:")), "")
        draw_plan(self.figure, rows, hosts, curve, here, bottleneck)
        self.view.show()

    def _show(self) -> None:
        """The status (the latest error, the selection's prediction, the latest run, a closed Lab)
        and the button's state."""
        with self._lock:
            closed = self._lab_closed()
            self.launch_button.disabled = self.lab is None or closed or self._in_flight
            shut = RED.format(html.escape(f"distlab: {closed_text()}")) if closed else ""
            lines = [self._error_line, self._plan_line, self._run_line, shut]
            self.status.value = "<br>".join(line for line in lines if line)

    def _lab_closed(self) -> bool:
        return bool(getattr(self.lab, "closed", False))

    def _on_change(self, change: dict[str, Any]) -> None:
        with self._reporting("update"), self._lock:
            if self._busy:
                return
            owner = change.get("owner")
            if owner is self.network and self.network.value != "custom":
                self._preset_link()
            elif owner in (self.net_bandwidth, self.net_latency) and self.network.value != "custom":
                self._busy = True
                try:
                    self.network.value = "custom"
                finally:
                    self._busy = False
            rank = owner in (self.hosts, self.per_host, self.network, self.net_bandwidth, self.net_latency)
            self._refresh(rank=rank)

    def _preset_link(self) -> None:
        """The network preset's figures into the bandwidth and latency boxes."""
        from distlab.costmodel.whatif import NETWORKS

        latency, bandwidth = NETWORKS[self.network.value] or self._calibrated_link
        self._busy = True
        try:
            self.net_bandwidth.value = round(bandwidth * 8 / 1e9, 3)
            self.net_latency.value = round(latency * 1e6, 2)
        finally:
            self._busy = False

    def _on_noise(self, change: dict[str, Any]) -> None:
        with self._reporting("noise scale"), self._lock:
            if self._busy:
                return
            self._refresh()
            self._label_rows(self.resources())

    def _on_measure(self, _button: Any = None) -> Any:
        """Measure the model's gradient noise scale on its data (in this process) and use it."""
        from distlab.runtime.noise_probe import measure_noise_scale

        with self._reporting("measure"):
            if self.model is None or self.data is None:
                raise DistlabError(
                    "measure φ: create the picker with model=... and data=... (or use %distlab pick VAR "
                    "--data DS)"
                )
            with self._lock:
                self._plan_line = "measuring the gradient noise scale on the model's data ..."
                self._show()
            m = measure_noise_scale(self.model, self.data, self.loss, batch_size=self.profile.batch_size)
            self.noise_measurement = m
            self.noise_scale.value = round(m.noise_scale, 4)  # redraws through _on_noise
            with self._lock:
                self._run_line = html.escape(f"measured: {m}")
                self._show()
            return m
        return None

    def _on_pick(self, change: dict[str, Any]) -> None:
        with self._reporting("pick"), self._lock:
            if self._busy or change["new"] is None:
                return
            row = self._ranked.iloc[change["new"]]
            plan = row["plan"]  # of a merged tie, the first; of the single-process row, AllReduce on 1 worker
            self._busy = True
            try:
                self.builder.value = plan.builder
                self.set_world(int(row["world"]))
                show_options(self, plan)
            finally:
                self._busy = False
            self._refresh()

    @contextlib.contextmanager
    def _reporting(self, what: str) -> Iterator[None]:
        """Show any error of a callback in the widget, as one red line; an unexpected one's traceback
        goes to a log file whose path the line gives."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - an error in a widget callback must show in the widget
            text = " ".join(str(exc).split())
            if isinstance(exc, DistlabError):
                line = f"distlab: {text}"
            else:
                where = self._log(exc, what)
                line = f"distlab: {what} failed: {type(exc).__name__}: {text} (traceback: {where})"
            self._error_line = RED.format(html.escape(line))
            # a callback on the client's event thread never waits long for a redraw
            if not self._lock.acquire(timeout=1.0):
                self.status.value = self._error_line
                return
            try:
                self._show()
            except Exception:  # noqa: BLE001 - the error itself must still show
                self.status.value = self._error_line
            finally:
                self._lock.release()

    def _log(self, exc: BaseException, what: str) -> str:
        try:
            if self.log_path is None:
                fd, name = tempfile.mkstemp(prefix="distlab-picker-", suffix=".log")
                with open(fd, "w", encoding="utf-8"):
                    pass
                self.log_path = Path(name)
            with self.log_path.open("a", encoding="utf-8") as f:
                f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n")
                f.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
            return str(self.log_path)
        except OSError as err:
            return f"not written: {err}"

    # -- the result ---------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        if self.value is None:
            raise DistlabError("StrategyPicker.save: no strategy is selected")
        return self.value.save(path)
