"""NotebookSession: the state one notebook's magics share (its Lab, profiles, data, runs).

The session outlives any one Lab: run history belongs to the notebook, so it survives
``%distlab cluster stop`` and a change of cluster. The cost model belongs to the Lab
(``lab.cost_model``); the session reads it from there.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from distlab.errors import DistlabError, LaunchError
from distlab.profiling.model_profile import DEFAULT_BATCH

if TYPE_CHECKING:
    from distlab.lab import Lab


@dataclasses.dataclass
class ModelInputs:
    """What the session remembers for one model variable: its data, sample batch, loss and
    per-replica batch, with the notebook variables they came from (for messages and cards)."""

    data: Any = None
    data_var: str | None = None
    sample_input: Any = None
    sample_var: str | None = None
    loss: Any = None
    loss_var: str | None = None
    batch_size: int | None = None

    @property
    def batch(self) -> int:
        return self.batch_size or DEFAULT_BATCH


class NotebookSession:
    """Owns what the ``%distlab`` magics create, so nothing lives in a process-global singleton.

    The Lab is created on first need (the embedded LocalCluster) unless ``start_lab`` chose
    another. A failed start leaves the working Lab as it was.
    """

    def __init__(self) -> None:
        self.current_lab: Any = None
        self.profiles: dict[str, Any] = {}
        self.inputs: dict[str, ModelInputs] = {}
        self.runs: list[Any] = []  # every run of this notebook, across Labs
        self._profile_keys: dict[str, tuple[int, ...]] = {}

    # -- what the user gave for a model ----------------------------------------------------------
    def remember(self, var: str, **given: Any) -> ModelInputs:
        """Update what is remembered for model ``var`` with the fields given (None: unchanged)."""
        from distlab.data import as_dataset

        inputs = self.inputs.setdefault(var, ModelInputs())
        if given.get("data") is not None:
            given["data"] = as_dataset(given["data"], f"--data {given.get('data_var') or ''}".strip())
        for key, value in given.items():
            if value is not None:
                setattr(inputs, key, value)
        return inputs

    def remembered(self) -> dict[str, ModelInputs]:
        """A copy of what is remembered, for ``restore`` after a magic that failed."""
        return {var: dataclasses.replace(inputs) for var, inputs in self.inputs.items()}

    def restore(self, remembered: dict[str, ModelInputs]) -> None:
        self.inputs = remembered

    def inputs_of(self, var: str) -> ModelInputs:
        return self.inputs.get(var) or ModelInputs()

    # -- profiles -------------------------------------------------------------------------
    def profile(self, var: str, model: Any) -> Any:
        """Profile ``model`` on its remembered sample or a batch of its data (cached per variable,
        model object, batch and inputs)."""
        from distlab.profiling.model_profile import ModelProfile

        if isinstance(model, ModelProfile):
            return model
        inp = self.inputs_of(var)
        key = (id(model), inp.batch, id(inp.data), id(inp.sample_input))
        if var in self.profiles and self._profile_keys.get(var) == key:
            return self.profiles[var]
        import distlab

        sample = inp.sample_input
        if sample is None and inp.data is not None:
            from distlab.keras_model import as_module
            from distlab.runs.validate import check_data

            sample = check_data(inp.data, as_module(model), inp.loss, inp.batch)[0]
        prof = distlab.profile(model, sample_input=sample, batch_size=inp.batch)
        self.profiles[var] = prof
        self._profile_keys[var] = key
        return prof

    # -- the cluster ------------------------------------------------------------------------
    def start_lab(self, workers: int | None = None, address: str | None = None) -> Any:
        """Start (or attach) a new Lab, then stop the old one: a failed start keeps the old."""
        from distlab.cluster.interrupts import interrupts_held
        from distlab.lab import Lab

        with interrupts_held(reraise=False) as pressed:  # the stop button: the new Lab closed, whole
            try:
                lab = Lab(workers=workers) if address is None else Lab(address=address)
            except DistlabError as exc:
                raise DistlabError(f"{exc}{self._kept()}") from None
            except Exception as exc:  # noqa: BLE001 - Dask's own failures: one line, the old cluster kept
                first = (str(exc).splitlines() or [""])[0][:200]
                raise LaunchError(
                    f"cluster: could not start ({type(exc).__name__}: {first}){self._kept()}"
                ) from None
            if pressed:
                lab.close()
                raise KeyboardInterrupt
            lab.via_magics = True
            old, self.current_lab = self.current_lab, lab
            if old is not None:
                self._harvest(old)
                old.close()
        return lab

    def _harvest(self, lab: Lab) -> None:
        """Keep ``lab``'s runs (the picker's too) in the notebook's history."""
        for run in lab.history:
            if all(run is not r for r in self.runs):
                self.runs.append(run)

    def _kept(self) -> str:
        return "; the previous cluster is still running" if self.current_lab is not None else ""

    def stop_lab(self) -> str:
        if self.current_lab is None:
            return "no cluster to stop"
        lab, self.current_lab = self.current_lab, None
        self._harvest(lab)
        lab.close()
        return f"cluster stopped; this notebook's {len(self.runs)} run(s) are kept (%distlab compare)"

    def lab(self) -> Any:
        """The notebook's Lab, started on first need (or again after one was closed)."""
        if self.current_lab is not None and self.current_lab.closed:
            self._harvest(self.current_lab)
            self.current_lab = None
        if self.current_lab is None:
            self.start_lab()
        self.heal()
        return self.current_lab

    def heal(self) -> None:
        """Workers of the notebook's cluster that died (killed, crashed) are restarted, in one line."""
        lab = self.current_lab
        if lab is not None and not lab.closed and (lost := lab.lost_workers):
            print(f"distlab: {lost} worker(s) of the cluster were lost; restarting them", flush=True)
            lab.heal()

    def resources(self, workers: int | None = None) -> Any:
        """The notebook's cluster (started on first need); ``workers`` asks what-if."""
        res = self.lab().resources
        if workers is not None and res.world != workers:
            res = res.with_world(workers)
        return res

    # -- cost model ---------------------------------------------------------------------------
    @property
    def cost_model(self) -> Any:
        """The Lab's cost model (calibrated, refitted on its runs), else the default."""
        lab = self.current_lab
        if lab is not None and lab.cost_model is not None:
            return lab.cost_model
        from distlab.costmodel import CostModel

        return CostModel.default()

    def calibrate(self, force: bool = False, models: Any = ()) -> Any:
        """``lab.calibrate``; ``models``: (var, model) pairs, each with its remembered data."""
        lab = self.lab()
        given = []
        for var, model in models:
            inp = self.inputs_of(var)
            given.append(model if inp.data is None else (model, inp.data, inp.loss))
        batch = max((self.inputs_of(v).batch for v, _ in models), default=DEFAULT_BATCH)
        return lab.calibrate(cache=not force, models=given, batch_size=batch)

    def simulate(self, var: str, model: Any, workers: int | None = None) -> Any:
        """Every candidate and the single-process baseline, ranked (``notebook.ranking``)."""
        import distlab
        from distlab.notebook.ranking import ranking

        prof = self.profile(var, model)
        res = self.resources(workers)
        self._measure(var, model, prof)
        cands = distlab.strategy.candidates(prof, res)
        if not cands:
            raise DistlabError(f"simulate: no candidate strategy for {var} on {res.world} ranks")
        table = ranking(self.cost_model, prof, res, cands)
        if not self.cost_model.fingerprint.get("calibrated"):  # said more exactly than CostModel.notes
            table.attrs["note"] = "; ".join(
                n
                for n in (
                    table.attrs["single_note"],
                    *(n for n in table.attrs["notes"] if not n.startswith("not calibrated")),
                    "predicted with the default cost model: the model's step was measured on the "
                    "workers, the collectives were not; %distlab calibrate measures them on this "
                    "cluster (seconds, cached)",
                )
                if n
            )
        return table

    def picker(self, var: str, model: Any) -> Any:
        from distlab.notebook.picker import StrategyPicker

        prof = self.profile(var, model)
        lab = self.lab()
        self._measure(var, model, prof)
        inp = self.inputs_of(var)
        return StrategyPicker(prof, lab, self.cost_model, model=model, data=inp.data, loss=inp.loss)

    def _measure(self, var: str, model: Any, prof: Any) -> None:
        """With a cluster, the model's compute comes from its own step on the workers (cached)."""
        from distlab.profiling.model_profile import ModelProfile

        if isinstance(model, ModelProfile):
            return
        inp = self.inputs_of(var)
        self.current_lab.measure_model(model, data=inp.data, loss=inp.loss, batch_size=prof.batch_size)

    # -- runs ------------------------------------------------------------------------------------
    def adaptive(self, var: str, model: Any, strategy: Any) -> Any:
        """``strategy`` (a builder name, a Strategy, a JSON path) trained with an adaptive batch:
        the AdaptiveBatch builder over its builder and options (unchanged if it already is one)."""
        import distlab

        if isinstance(strategy, str) and (os.path.exists(strategy) or strategy.endswith(".json")):
            strategy = distlab.Strategy.load(strategy)
        if isinstance(strategy, distlab.Strategy):
            if strategy.builder == "AdaptiveBatch":
                return strategy
            if strategy.builder == "custom":
                raise DistlabError(
                    f"--adaptive: strategy {strategy.name} was not made by a builder, so it cannot be "
                    "re-planned with an adaptive batch; give a builder name (e.g. --strategy AllReduce "
                    "--adaptive)"
                )
            base, options = strategy.builder, dict(strategy.options)
        else:
            base, options = str(strategy), {}
        inp = self.inputs_of(var)
        options.setdefault("batch_size", inp.batch_size)
        options = {k: v for k, v in options.items() if v is not None}
        if base == "AdaptiveBatch":
            return distlab.strategy.build(base, self.profile(var, model), self.resources(), **options)
        return distlab.strategy.build(
            "AdaptiveBatch", self.profile(var, model), self.resources(), base=base, **options
        )

    def launch(
        self,
        var: str,
        model: Any,
        strategy: Any,
        steps: int,
        optimizer: Any = None,
        lr: float | None = None,
        backend: str = "torch",
    ) -> Any:
        inp = self.inputs_of(var)
        lab = self.lab()
        if lab.cost_model is None:  # predicted as simulate ranks it: the default model, the step measured
            from distlab.costmodel import CostModel

            lab.cost_model = CostModel.default()
        run = lab.launch(
            model,
            strategy=strategy,
            steps=steps,
            data=inp.data,
            loss=inp.loss,
            batch_size=inp.batch_size,
            optimizer=optimizer,
            lr=lr,
            backend=backend,
        )
        self.runs.append(run)
        return run

    def runs_frame(self) -> Any:
        """Every run of this notebook (``lab.runs``' columns), across the Labs it used."""
        from distlab.runs.report import runs_frame

        if self.current_lab is not None:
            self._harvest(self.current_lab)
        if not self.runs:
            raise DistlabError(
                "compare: no runs yet in this notebook; launch one with %distlab launch VAR --strategy NAME"
            )
        return runs_frame(self.runs)
