"""CostModel: predict, rank and sweep strategies with the vectorised simulator; save and load calibrations.

Long because CostModel is the cost model's one public class: each method is a short entry point (predict,
rank, sweep, refit, save and load, the with_ variants) and their docstrings are its reference; the work
lives in the modules beside it."""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from distlab.adaptive.goodput import statistical_efficiency
from distlab.costmodel import consistency, convergence, gossip_pricing
from distlab.costmodel.calibrate import check_links_measured, fit_microbenchmarks, fit_overhead
from distlab.costmodel.collectives import COLLECTIVES, LINK_CLASSES
from distlab.costmodel.compile import (
    CompiledStrategy,
    ProfileTiming,
    compile_strategy,
    profile_timing,
)
from distlab.costmodel.compute import ComputeTable, model_key
from distlab.costmodel.contention import slowdown, time_slicing
from distlab.costmodel.evaluate import Batch, Env, evaluate, link_arrays
from distlab.costmodel.links import bottleneck
from distlab.costmodel.model_card import card_html, describe
from distlab.costmodel.native import NativeParams
from distlab.costmodel.params import CostParams, fingerprint_of, optimizer_kind
from distlab.costmodel.prediction import MEASURED_STEP, PROFILE, Prediction
from distlab.costmodel.refit import HALFLIFE, PRIOR, Correction, apply, fit_corrections
from distlab.costmodel.rows import CollectiveRow, LocalStep, LoopRun
from distlab.errors import CalibrationError, StrategyError
from distlab.profiling.model_profile import ModelProfile
from distlab.resources import Link, ResourceSpec
from distlab.strategy.types import Strategy

MODEL_VERSION = 1
_CACHE_PRUNE = 50_000
_BATCHES_KEPT = 8


# Prediction.detail; hidden: the backward tasks' time that hid behind backward (overlap_loss prices it)
DETAIL = ("backward", "sparse", "broadcast", "gossip", "calls", "backward_total", "hidden")


class CostModel:
    """Data-parallel step-time model (DESIGN.md, Cost model); pure, deterministic, fast.

    ``params`` holds the calibrated numbers; ``fingerprint`` says what they were calibrated on;
    ``throughput_fit`` holds the structural model ``CostModel.fit`` learned from job logs;
    ``compute_runs`` the local steps ``Lab.calibrate(models=...)`` measured (compute.py): a
    model found there computes as measured on the cluster, the others as profiled and scaled;
    ``refits`` the per-model factors ``refit`` fitted to finished runs (refit.py), applied to
    every prediction of those models.
    """

    def __init__(
        self,
        params: CostParams | None = None,
        fingerprint: dict[str, Any] | None = None,
        throughput_fit: dict[str, float] | None = None,
        compute_runs: Sequence[LocalStep | Mapping[str, Any]] = (),
        refits: Mapping[str, Correction] | None = None,
        native: NativeParams | None = None,
    ) -> None:
        self.params = params or CostParams()
        self.fingerprint: dict[str, Any] = dict(fingerprint or {"calibrated": False})
        self.throughput_fit = dict(throughput_fit) if throughput_fit else None
        self.compute = ComputeTable(compute_runs)
        self.refits: dict[str, Correction] = dict(refits or {})
        self.native = (
            native  # TensorFlow's figures on this cluster (native.py), from calibrate(backend="tensorflow")
        )
        self._compiled: dict[tuple[Any, ...], tuple[Any, Any, CompiledStrategy]] = {}
        self._timings: dict[int, tuple[Any, ProfileTiming]] = {}
        self._batches: dict[
            tuple[int, ...], Batch
        ] = {}  # last stacked candidate lists (the picker re-ranks them)

    @classmethod
    def default(cls) -> CostModel:
        """An uncalibrated model: link figures from the ResourceSpec, textbook contention and optimizer
        costs."""
        return cls()

    # -- compilation cache ------------------------------------------------------------
    def _replace(self, **changes: Any) -> CostModel:
        """A new model with ``changes`` to its constructor's arguments (the rest copied): the one
        copy constructor ``refit``, ``with_*`` and ``without_*`` go through (this model is unchanged;
        its caches are not shared)."""
        args: dict[str, Any] = {
            "params": self.params,
            "fingerprint": dict(self.fingerprint),
            "throughput_fit": self.throughput_fit,
            "compute_runs": self.compute.to_rows(),
            "refits": self.refits,
            "native": self.native,
        }
        return type(self)(**{**args, **changes})

    def compile(self, profile: ModelProfile, strategy: Strategy) -> CompiledStrategy:
        """The strategy as numbers, cached per (profile, strategy) identity."""
        key = (id(profile), id(strategy), self.params.bucket_bytes, self.params.ddp)
        hit = self._compiled.get(key)
        if hit is not None and hit[0]() is profile and hit[1]() is strategy:
            return hit[2]
        if not isinstance(strategy, Strategy):
            raise StrategyError(f"candidates: expected Strategy objects, got {type(strategy).__name__}")
        t = self._timings.get(id(profile))
        if t is None or t[0]() is not profile:
            t = (weakref.ref(profile), profile_timing(profile))
            self._timings[id(profile)] = t
        compiled = compile_strategy(profile, strategy, t[1], self.params.bucket_bytes, self.params.ddp)
        if len(self._compiled) > _CACHE_PRUNE:  # drop the entries whose profile or strategy is gone
            self._compiled = {k: v for k, v in self._compiled.items() if None not in (v[0](), v[1]())}
        self._compiled[key] = (weakref.ref(profile), weakref.ref(strategy), compiled)
        return compiled

    # -- environment -------------------------------------------------------------------
    def link_table(self, resources: ResourceSpec | None) -> dict[str, dict[str, tuple[float, float]]]:
        """``table[link][collective] -> (alpha, beta)`` for both link classes."""
        return {
            lk: {c: self.params.alpha_beta_for(c, lk, resources) for c in COLLECTIVES} for lk in LINK_CLASSES
        }

    def links(self, resources: ResourceSpec | None = None) -> dict[str, Link]:
        """Point-to-point figures per link class, to fill a ``ResourceSpec.links`` after calibration:
        a one-way message's where measured (``send``: the link's own rate), else an exchange's."""
        table = self.link_table(resources)
        out = {}
        for lk in LINK_CLASSES:
            c = "send" if f"send/{lk}" in self.params.alpha_beta else "sendrecv"
            out[lk] = Link(table[lk][c][0], 1.0 / max(table[lk][c][1], 1e-30))
        return out

    def slowdowns(self, c: CompiledStrategy, hosts: Sequence[tuple[int, int | None]]) -> tuple[float, float]:
        """How much slower than profiled the busiest host's ranks compute, with ``hosts`` = (ranks, cores)
        per host: (for this model: measured where calibrated; for the optimizer's arithmetic: the
        contention model)."""
        prm = self.params
        e = prm.thread_efficiency if c.profile_thread_efficiency is None else c.profile_thread_efficiency

        def model(n: int, cores: int | None) -> float:
            if c.gpu:  # a GPU rank's step slows with the ranks sharing its device, not the host's cores
                return float(c.device_share)
            return slowdown(n, cores, prm.contention, c.profile_threads, e, prm.oversubscription)

        if not hosts:
            share = float(c.device_share) if c.gpu else 1.0
            return share, share
        n, cores = max(hosts, key=lambda h: (model(*h), h[0]))
        structural = model(n, cores)
        if c.model_key not in self.compute:
            return structural, structural
        # the model's own local step measured on the cluster: the slowdown that reproduces it
        measured = self.compute.lookup(c.model_key, n, cores, c.per_replica, model)
        profiled = c.accum * (c.fwd + c.bwd) * prm.compute_scale
        if measured is None or profiled <= 0:
            return structural, structural
        loop = prm.step_overhead + prm.tensor_overhead * c.n_tensors + prm.lockstep_overhead * (c.world > 1)
        return max(c.accum * measured - loop, 0.1 * c.accum * measured) / profiled, structural

    def _env(self, batch: Batch, resources: ResourceSpec | None) -> Env:
        table = self.link_table(resources)
        alpha, beta = link_arrays(batch.multi_host, table)
        memo: dict[Any, tuple[float, float, float]] = {}
        slow, opt_slow, sliced = (np.empty(len(batch.items)) for _ in range(3))
        cores = resources.cores if resources is not None else {}
        for i, c in enumerate(batch.items):
            k = (
                c.hosts,
                c.gpu,
                c.device_share,
                c.profile_threads,
                c.profile_thread_efficiency,
                c.model_key,
                c.per_replica,
                c.accum,
                c.fwd + c.bwd,
                c.n_tensors,
            )
            if k not in memo:
                memo[k] = (
                    *self.slowdowns(c, [(n, cores.get(h)) for h, n in c.hosts]),
                    max((time_slicing(n, cores.get(h)) for h, n in c.hosts), default=1.0),
                )
            slow[i], opt_slow[i], sliced[i] = memo[k]
        deg = np.fromiter((c.gossip_degree for c in batch.items), dtype=float, count=len(batch.items))
        return Env(
            batch.world[:, None],
            alpha,
            beta,
            slow[:, None],
            deg[:, None],
            sliced=sliced[:, None],
            optimizer_slowdown=opt_slow[:, None],
            params=self.params,
            intra_exchange=table["intra"]["sendrecv"],
        )

    # -- predictions -------------------------------------------------------------------
    def evaluate_many(
        self,
        profile: ModelProfile,
        resources: ResourceSpec | None,
        strategies: Sequence[Strategy],
        optimizer: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Raw simulator output for many strategies: arrays of shape (S,) per quantity."""
        return self.evaluate_compiled([self.compile(profile, s) for s in strategies], resources, optimizer)

    def evaluate_compiled(
        self, items: Sequence[CompiledStrategy], resources: ResourceSpec | None, optimizer: str | None = None
    ) -> dict[str, np.ndarray]:
        """Raw simulator output for compiled strategies (``compile``), of one model or several,
        in one vectorised pass: arrays of shape (S,) per quantity, each model's refit applied."""
        key = tuple(map(id, items))  # the batch holds the items, so their ids stay theirs
        batch = self._batches.get(key)
        if batch is None:
            batch = Batch.stack(items)
            if len(self._batches) >= _BATCHES_KEPT:
                self._batches.pop(next(iter(self._batches)))
            self._batches[key] = batch
        # what the environment depends on; dicts inside frozen specs can still change, so compare them
        sig = (
            self.params,
            tuple(sorted(self.params.alpha_beta.items())),
            None
            if resources is None
            else (tuple(sorted(resources.links.items())), tuple(sorted(resources.cores.items()))),
        )
        hit = batch.env_cache.get(id(resources))
        if hit is not None and hit[0] == sig and (resources is None or hit[1]() is resources):
            env = hit[2]
        else:
            env = self._env(batch, resources)
            ref = weakref.ref(resources) if resources is not None else None
            batch.env_cache = {id(resources): (sig, ref, env)}
        work, per_tensor = self.params.optimizer_work(optimizer), self.params.optimizer_tensor(optimizer)
        stateful = optimizer_kind(optimizer) != "sgd"
        if (work, per_tensor, stateful) != (env.optimizer_work, env.optimizer_tensor, env.stateful):
            env = replace(env, optimizer_work=work, optimizer_tensor=per_tensor, stateful=stateful)
        out = {k: v[:, 0] for k, v in evaluate(batch, env).items()}
        if self.refits:
            fixes = [self.refits.get(c.model_key) for c in items]
            if any(fixes):
                out = apply(
                    out,
                    np.array([f.compute if f else 1.0 for f in fixes]),
                    np.array([f.comm if f else 1.0 for f in fixes]),
                )
        return out

    def predict(
        self,
        profile: ModelProfile,
        resources: ResourceSpec | None,
        strategy: Strategy,
        noise_scale: float | None = None,
        base_batch: int | None = None,
        optimizer: str | None = None,
        clocks: bool = True,
    ) -> Prediction:
        """Predicted step of one strategy; with ``noise_scale`` also goodput (Pollux statistical
        efficiency). ``optimizer``: the run's (a name or ``"sgd"``/``"momentum"``/``"adam"``;
        ``distlab.conventions.optimizer_kind`` maps a factory); None is the launch default, Adam.
        ``clocks=False``: the kernels' figure alone, before stale PS and gossip meet the ranks' clocks."""
        c = self.compile(profile, strategy)
        out = self.evaluate_compiled([c], resources, optimizer)
        gb = c.per_replica * c.accum * c.world
        eff = good = None
        if noise_scale is not None:
            eff = float(statistical_efficiency(gb, noise_scale, base_batch or profile.batch_size))
            good = float(out["throughput"][0]) * eff
        step = float(out["step_time"][0])
        pred = Prediction(
            basis=self.basis(c),
            notes=self.notes(profile, resources, strategy) + self._bottleneck(c, resources, step, optimizer),
            strategy=strategy.name,
            world=c.world,
            global_batch=gb,
            step_time=step,
            throughput=float(out["throughput"][0]),
            breakdown={k: float(out[k][0]) for k in ("compute", "comm", "optimizer")},
            detail={k: float(out[k][0]) for k in DETAIL},
            goodput=good,
            efficiency=eff,
        )
        # on the ranks' clocks: stale or asynchronous PS (consistency.py), gossip (gossip_pricing.py)
        if clocks and strategy.stale:
            pred = consistency.price(self, profile, resources, strategy, optimizer=optimizer, base=pred)
        elif clocks and strategy.gossip is not None:
            pred = gossip_pricing.price(self, profile, resources, strategy, optimizer=optimizer, base=pred)
        return pred

    def _bottleneck(
        self, c: CompiledStrategy, resources: ResourceSpec | None, step: float, optimizer: str | None
    ) -> tuple[str, ...]:
        """The host link that bounds the step, as a note (links.bottleneck), or none."""
        if not c.link_hosts:
            return ()
        table, prm = self.link_table(resources), self.params
        send, exchange = table["inter"]["send"][1], table["inter"]["sendrecv"][1]
        stateful = optimizer_kind(optimizer) != "sgd"
        # send: the link's own rate (evaluate.py)
        note = bottleneck(c, send, exchange, prm.incast, prm.outcast, step, stateful)
        return (note,) if note else ()

    def basis(self, c: CompiledStrategy) -> str:
        """``"measured step"`` when the model's own step was measured on the cluster, else ``"profile"``."""
        return MEASURED_STEP if c.model_key in self.compute else PROFILE

    def notes(
        self, profile: ModelProfile, resources: ResourceSpec | None = None, strategy: Strategy | None = None
    ) -> tuple[str, ...]:
        """What a prediction from this model and ``profile`` should say beside its figure: collectives
        never calibrated, a profile timed while other programs used the cores, a profile of another
        batch than ``strategy``'s, a model too large for the workers of ``resources``."""
        out = []
        if not self.fingerprint.get("calibrated"):
            out.append(
                "not calibrated: default collectives and compute figures; %distlab calibrate "
                "(lab.calibrate()) measures this cluster"
            )
        if profile.meta.get("disturbed"):
            load = profile.meta.get("load") or {}
            out.append(
                f"profiled under load: other programs used {float(load.get('foreign', 0)):.1f} of "
                f"{load.get('cores', '?')} cores while dl.profile timed it; profile again on a quiet machine"
            )
        if strategy is not None and strategy.batch.per_replica != profile.batch_size:
            out.append(
                f"profiled at batch {profile.batch_size}, predicted at {strategy.batch.per_replica} per "
                "replica: compute scaled by the profile's two-batch fit; profile at the run's batch "
                f"(dl.profile(model, batch_size={strategy.batch.per_replica})) for its own step"
            )
        need = training_bytes(profile, strategy.batch.per_replica if strategy is not None else None)
        have = min((resources.memory.values() if resources is not None else ()), default=0)
        if have and need > have:
            out.append(
                f"does not fit: training needs about {need / 2**30:.1f} GiB per rank (weights, "
                f"gradients, optimizer state, activations), a worker may use {have / 2**30:.1f} GiB; "
                "give the workers more memory or shard the model (PartitionedPS)"
            )
        return tuple(out)

    def rank(
        self,
        profile: ModelProfile,
        resources: ResourceSpec | None,
        candidates: Sequence[Strategy],
        noise_scale: float | None = None,
        base_batch: int | None = None,
        optimizer: str | None = None,
        staleness_cost: Mapping[Any, float] | None = None,
    ):  # -> pandas.DataFrame
        """Every candidate's prediction, best first (by goodput when a noise scale or ``staleness_cost``,
        g per staleness from ``Lab.probe_staleness``, is given, else throughput). Stale and
        asynchronous PS plans are priced at their consistency (costmodel/consistency.py),
        asynchronous gossip at each rank's own pace (costmodel/gossip_pricing.py).

        Without ``staleness_cost`` a stale or asynchronous plan's ``note`` says its convergence is
        not counted; with it, a staleness not probed is unpriced: goodput NaN, ranked last
        (``consistency.rerank``).

        Columns: strategy (name), builder, world, per_replica, throughput, step_time, compute, comm,
        optimizer, basis (``"measured step"`` or ``"profile"``), [efficiency, goodput], note (what
        the figure leaves out, or ""), index (position in ``candidates``), plan (the Strategy).
        ``table.attrs["notes"]``: what every row's figure should be read with (``CostModel.notes``).
        """
        import pandas as pd

        cands = list(candidates)
        items = [self.compile(profile, s) for s in cands]
        empty = dict.fromkeys(
            ("throughput", "step_time", "compute", "comm", "optimizer", "world"), np.zeros(0)
        )
        out = self.evaluate_compiled(items, resources, optimizer) if items else empty
        df = pd.DataFrame(
            {
                "strategy": [c.name for c in items],
                "builder": [c.builder for c in items],
                "world": np.asarray(out["world"], dtype=int),
                "per_replica": [c.per_replica for c in items],
                "throughput": out["throughput"],
                "step_time": out["step_time"],
                "compute": out["compute"],
                "comm": out["comm"],
                "optimizer": out["optimizer"],
                "basis": [self.basis(c) for c in items],
            }
        )
        key = "throughput"
        if noise_scale is not None:
            gb = np.array([c.per_replica * c.accum * c.world for c in items], dtype=float)
            df["efficiency"] = statistical_efficiency(gb, noise_scale, base_batch or profile.batch_size)
            df["goodput"] = df["throughput"] * df["efficiency"]
            key = "goodput"
        df["index"] = np.arange(len(cands))
        df["plan"] = cands
        df = gossip_pricing.rerank(self, df, profile, resources, optimizer)
        df = consistency.rerank(self, df, profile, resources, optimizer, staleness_cost)
        key = "goodput" if "goodput" in df else key
        df.attrs["notes"] = (*self.notes(profile), *filter(None, [convergence.table_note(df)]))
        order = np.argsort(-df[key].to_numpy(dtype=float), kind="stable")  # NaN (unpriced) last
        return df.iloc[order].reset_index(drop=True)

    def sweep(
        self,
        profile: ModelProfile,
        resources: ResourceSpec,
        strategies: Sequence[Strategy],
        worlds: Sequence[int],
        bandwidths: Sequence[float | None] = (None,),
        optimizer: str | None = None,
    ):  # -> pandas.DataFrame
        """What-if: each strategy at each world size and bottleneck bandwidth; see ``whatif.sweep_frame``."""
        from distlab.costmodel.whatif import sweep_frame

        df = sweep_frame(self, profile, resources, strategies, worlds, bandwidths, optimizer)
        fix = self.refits.get(model_key(profile)) if self.refits else None
        if fix is None or not len(df):
            return df
        cols = ("throughput", "step_time", "compute", "comm", "optimizer")
        fixed = apply(
            {k: df[k].to_numpy() for k in cols}, np.full(len(df), fix.compute), np.full(len(df), fix.comm)
        )
        return df.assign(**fixed)

    # -- refit from runs ----------------------------------------------------------------
    def refit(self, runs: Any, prior: float = PRIOR, halflife: float | None = HALFLIFE) -> CostModel:
        """A new model whose predictions of each model in ``runs`` are corrected toward what its runs
        measured.

        ``runs``: ``lab.runs`` or any table with, per run in the order they ran, ``model_key``
        (compute.model_key of the profile), ``measured_step`` (s) and the uncorrected prediction
        made before it, ``predicted_compute``, ``predicted_comm``, ``predicted_optimizer`` (s);
        unfinished runs and rows with missing figures are skipped. Per model, predicted compute
        is multiplied by one fitted factor and comm and optimizer by another, pulled toward 1
        by ``prior``, recent runs weighing more (``halflife`` runs; refit.fit_corrections);
        step time and throughput follow. Models without runs keep this model's correction, if
        any; the others' are refitted from ``runs`` alone, so pass every run so far
        (``lab.runs`` holds them all): refitting a refitted model with all the runs gives the
        model refitted once with them. Pure: this model is unchanged.
        """
        fresh = fit_corrections(runs, prior=prior, halflife=halflife)
        return self._replace(refits={**self.refits, **fresh})

    def without_refit(self) -> CostModel:
        """This model without its refit corrections: the predictions a run's row should record for
        ``refit``."""
        return self._replace(refits=None)

    # -- calibration ------------------------------------------------------------------
    @classmethod
    def from_microbenchmarks(
        cls, rows: Sequence[CollectiveRow | Mapping[str, Any]], resources: ResourceSpec | None = None
    ) -> CostModel:
        """Fit alpha, beta per collective and link class and the contention factor (see calibrate.py)."""
        params, info = fit_microbenchmarks(rows, CostParams())
        if resources is not None:
            check_links_measured(params, info, resources)
        return cls(
            params, fingerprint_of(resources, {"calibrated": True, "source": "microbenchmarks", **info})
        )

    def with_overhead(self, runs: Sequence[LoopRun | Mapping[str, Any]]) -> CostModel:
        """This model plus the training loop's own cost, fitted to reference runs (calibrate.fit_overhead);
        the runs are kept, in their stored form, in ``fingerprint["overhead_runs"]``."""
        params = fit_overhead(self.params, runs)
        stored = [r.to_dict() if isinstance(r, LoopRun) else r for r in runs]
        return self._replace(params=params, fingerprint={**self.fingerprint, "overhead_runs": stored})

    def with_compute(self, runs: Sequence[LocalStep | Mapping[str, Any]]) -> CostModel:
        """This model plus measured local steps (compute.py); a new row replaces one for the same model,
        ranks, cores and batch."""
        new = ComputeTable(runs).to_rows()
        fresh = {(r["key"], int(r["ranks"]), r.get("cores"), int(r["batch"])) for r in new}
        kept = [
            r
            for r in self.compute.to_rows()
            if (r["key"], int(r["ranks"]), r.get("cores"), int(r["batch"])) not in fresh
        ]
        return self._replace(compute_runs=kept + new)

    def without_compute(self, keys: Any) -> CostModel:
        """This model less the measured local steps of the models ``keys`` (compute.model_key)."""
        drop = set(keys)
        return self._replace(compute_runs=[r for r in self.compute.to_rows() if r["key"] not in drop])

    def with_native(self, native: NativeParams) -> CostModel:
        """This model plus TensorFlow's figures (native.py; ``lab.calibrate(backend="tensorflow")``)."""
        return self._replace(native=native)

    def with_params(self, params: CostParams, **fingerprint: Any) -> CostModel:
        """This model with other params (the fingerprint gains ``fingerprint``'s entries)."""
        return self._replace(params=params, fingerprint={**self.fingerprint, **fingerprint})

    @classmethod
    def fit(cls, measurements: Any) -> CostModel:
        """Fit the structural throughput model to a table of measured runs (see fit.py)."""
        from distlab.costmodel.fit import fit_measurements

        params, theta, info = fit_measurements(measurements)
        return cls(
            params, fingerprint_of(None, {"calibrated": True, "source": "measurements", **info}), theta
        )

    def predict_table(self, df: Any) -> np.ndarray:
        """Predicted step time (s) for each row of a measurement table (columns as for ``fit``)."""
        from distlab.costmodel.fit import predict_measurements

        if self.throughput_fit is None:
            raise CalibrationError(
                "predict_table: this model was not fitted from measurements; use CostModel.fit(table) first"
            )
        return predict_measurements(self.throughput_fit, df)

    # -- persistence ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "version": MODEL_VERSION,
            "params": self.params.to_dict(),
            "fingerprint": self.fingerprint,
            "throughput_fit": self.throughput_fit,
            "compute_runs": self.compute.to_rows(),
            "refit": {k: c.to_dict() for k, c in sorted(self.refits.items())},
            "native": self.native.to_dict() if self.native is not None else None,
        }

    def save(self, path: str | Path) -> Path:
        """Write the calibration as JSON atomically (temp file + rename)."""
        from distlab.files import write_atomic

        return write_atomic(path, json.dumps(self.to_dict(), indent=1, default=str))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        try:
            d = json.loads(Path(path).read_text())
        except OSError as exc:
            raise CalibrationError(
                f"cost model file {str(path)!r}: cannot read it ({exc.strerror})"
            ) from None
        except json.JSONDecodeError as exc:
            raise CalibrationError(
                f"cost model file {str(path)!r}: not valid JSON ({exc.msg}); write it with CostModel.save()"
            ) from None
        if not isinstance(d, dict) or "params" not in d:
            raise CalibrationError(
                f"cost model file {str(path)!r}: no 'params'; write it with CostModel.save()"
            )
        return cls(
            CostParams.from_dict(d["params"]),
            d.get("fingerprint"),
            d.get("throughput_fit"),
            d.get("compute_runs") or (),
            {str(k): Correction.from_dict(c) for k, c in (d.get("refit") or {}).items()},
            NativeParams.from_dict(d["native"]) if d.get("native") else None,
        )

    def __repr__(self) -> str:
        return describe(self)

    def _repr_html_(self) -> str:
        return card_html(self)


def training_bytes(profile: ModelProfile, per_replica: int | None = None, optimizer_states: int = 2) -> int:
    """About what one rank holds to train ``profile``'s model: weights, gradients, ``optimizer_states``
    copies of the weights (Adam's two moments; SGD with momentum one) and the activations of a
    step at ``per_replica`` (the profile's batch when None), kept for backward."""
    weights = sum(v.nbytes for v in profile.variables)
    acts = sum(layer.activation_bytes for layer in profile.layers)
    scale = (per_replica or profile.batch_size) / max(profile.batch_size, 1)
    return int(weights * (2 + optimizer_states) + acts * scale)
