"""NotebookSession: the state one notebook's magics share (its Lab, cost model, profiles, runs)."""

from __future__ import annotations

from typing import Any

from distlab.errors import DistlabError


class NotebookSession:
    """Owns what the ``%distlab`` magics create, so nothing lives in a process-global singleton.

    The Lab is created on first need (the embedded LocalCluster) unless ``start_lab`` chose
    another; the cost model is the calibrated one once ``calibrate`` ran, else the default.
    """

    def __init__(self) -> None:
        self.current_lab: Any = None
        self.cost_model: Any = None
        self.profiles: dict[str, Any] = {}
        self._profile_keys: dict[str, tuple[int, int]] = {}

    # -- profiles -------------------------------------------------------------------------
    def profile(self, var: str, model: Any, batch_size: int | None = None) -> Any:
        """Profile ``model`` (cached per variable, model object and batch size)."""
        from distlab.profile.model_profile import ModelProfile

        if isinstance(model, ModelProfile):
            return model
        key = (id(model), batch_size or 0)
        if var in self.profiles and self._profile_keys.get(var) == key:
            return self.profiles[var]
        import distlab

        prof = distlab.profile(model, batch_size=batch_size or 32)
        self.profiles[var] = prof
        self._profile_keys[var] = key
        return prof

    # -- the cluster ------------------------------------------------------------------------
    def start_lab(self, workers: int | None = None, address: str | None = None) -> Any:
        from distlab.launch import Lab

        self.stop_lab()
        self.current_lab = Lab(workers=workers) if address is None else Lab(address=address)
        return self.current_lab

    def stop_lab(self) -> str:
        if self.current_lab is None:
            return "no cluster to stop"
        lab, self.current_lab = self.current_lab, None
        lab.close()
        return "cluster stopped"

    def lab(self) -> Any:
        """The notebook's Lab, started on first need."""
        if self.current_lab is None:
            self.start_lab()
        return self.current_lab

    def resources(self, workers: int | None = None) -> Any:
        """The live cluster's resources if a Lab runs, else this machine; ``workers`` asks what-if."""
        from distlab.resources import ResourceSpec

        res = self.current_lab.resources if self.current_lab is not None else ResourceSpec.local(workers=workers)
        if workers is not None and res.world != workers:
            res = res.with_world(workers)
        return res

    # -- cost model ---------------------------------------------------------------------------
    def calibrate(self, force: bool = False, models: Any = (), batch_size: int = 32) -> Any:
        lab = self.lab()
        self.cost_model = lab.calibrate(cache=not force, models=models, batch_size=batch_size)
        return self.cost_model

    def model_cost(self) -> Any:
        if self.cost_model is not None:
            return self.cost_model
        lab_cm = getattr(self.current_lab, "cost_model", None)
        if lab_cm is not None:
            return lab_cm
        from distlab.costmodel import CostModel

        return CostModel.default()

    def simulate(self, var: str, model: Any, workers: int | None = None) -> Any:
        import distlab

        prof = self.profile(var, model)
        res = self.resources(workers)
        self._measure(model, prof)
        cands = distlab.strategy.candidates(prof, res)
        if not cands:
            raise DistlabError(f"simulate: no candidate strategy for {var} on {res.world} ranks")
        return self.model_cost().rank(prof, res, cands)

    def picker(self, var: str, model: Any) -> Any:
        from distlab.notebook.picker import StrategyPicker

        prof = self.profile(var, model)
        lab = self.lab()
        self._measure(model, prof)
        return StrategyPicker(prof, lab, self.model_cost(), model=model)

    def _measure(self, model: Any, prof: Any) -> None:
        """With a cluster, the model's compute comes from its own step on the workers (cached)."""
        from distlab.profile.model_profile import ModelProfile

        if self.current_lab is None or isinstance(model, ModelProfile):
            return
        if self.current_lab.cost_model is None and self.cost_model is not None:
            self.current_lab.cost_model = self.cost_model
        self.cost_model = self.current_lab.measure_model(model, batch_size=prof.batch_size)

    # -- runs ------------------------------------------------------------------------------------
    def launch(self, var: str, model: Any, strategy: Any, steps: int) -> Any:
        lab = self.lab()
        if lab.cost_model is None and self.cost_model is not None:
            lab.cost_model = self.cost_model
        return lab.launch(model, strategy=strategy, steps=steps)

    def runs_frame(self) -> Any:
        if self.current_lab is None:
            raise DistlabError("compare: no runs yet in this notebook; launch one with %distlab launch VAR --strategy NAME")
        runs = self.current_lab.runs
        if len(runs) == 0:
            raise DistlabError("compare: no runs yet in this notebook; launch one with %distlab launch VAR --strategy NAME")
        return runs
