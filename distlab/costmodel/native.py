"""NativeParams: what a native TensorFlow run costs on this cluster, and its prediction.

A native AllReduce run (``lab.launch(keras_model, backend="tensorflow")``) is a TensorFlow
process per rank under ``MultiWorkerMirroredStrategy``: none of distlab's torch runtime (its
buckets, hooks, loop) takes part, so the torch-runtime model does not describe it.
``lab.calibrate(backend="tensorflow")`` measures TensorFlow's own side under that strategy, on
the Lab's workers (``native_tf/calibrate.py``, ``native_tf/child.py``'s ``bench``):

- its all-reduce (TensorFlow's collective ops: a ring on CPUs) at message sizes from 4 KiB to
  16 MiB, fitted as ``alpha * 2(p-1) + beta * 2(p-1)/p * n`` (collectives.py);
- a reference Keras model's step twice, locally and under the strategy: the excess of the second
  over the first plus its gradients' all-reduce is the strategy's own cost per step
  (``strategy_overhead``: the replica context, the per-tensor collective launches, the reduced loss);
- each Keras model passed in ``models=``: its local step (no strategy), every rank stepping at
  once as in a run, at two per-replica batches (``local``: ``seconds = a + s * batch``).

A step is predicted as local step + all-reduce of the gradient bytes + ``strategy_overhead``;
a model whose local step was not measured natively starts from the torch-runtime model's
compute and optimizer (``detail["native_local_measured"] = 0``). Sparse gradients are counted
dense (TensorFlow all-gathers them: the dense bound is what a table's step cannot exceed much
at these sizes). ParameterServerStrategy runs are asynchronous rounds and are not predicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from distlab.costmodel.collectives import collective_time
from distlab.costmodel.prediction import MEASURED_STEP, Prediction
from distlab.errors import CalibrationError

if TYPE_CHECKING:
    from distlab.costmodel.model import CostModel
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec
    from distlab.strategy.types import Strategy

NATIVE_VERSION = 1


@dataclass(frozen=True)
class NativeParams:
    """TensorFlow's figures on one cluster (see the module's docstring)."""

    world: int
    """Ranks the all-reduce and the local steps were measured on."""
    allreduce: tuple[float, float]
    """(alpha s, beta s/byte) of ``MultiWorkerMirroredStrategy``'s all-reduce."""
    strategy_overhead: float
    """Seconds per step of the strategy's own work beyond local step and all-reduce."""
    local: dict[str, dict[int, float]] = field(default_factory=dict)
    """compute.model_key -> per-replica batch -> seconds of a local step, every rank busy."""
    tensorflow: str | None = None
    """TensorFlow's version measured."""
    fit_error: float = 0.0
    """Median relative error of the all-reduce fit over its sizes."""

    def __post_init__(self) -> None:
        a, b = self.allreduce
        if self.world < 2 or a < 0 or b < 0 or self.strategy_overhead < 0:
            raise CalibrationError(
                "native: world >= 2 and non-negative alpha, beta and "
                f"strategy_overhead expected, got {self!r}; "
                "measure them with lab.calibrate(backend='tensorflow')"
            )

    def with_local(self, local: dict[str, dict[int, float]]) -> NativeParams:
        """These figures plus more models' local steps (a model measured again replaces its old rows)."""
        return NativeParams(
            self.world,
            self.allreduce,
            self.strategy_overhead,
            {**self.local, **local},
            self.tensorflow,
            self.fit_error,
        )

    def local_step(self, key: str, batch: int) -> float | None:
        """A model's measured local step at ``batch`` (a line through its measured batches), or None."""
        rows = self.local.get(key)
        if not rows:
            return None
        b = np.array(sorted(rows), dtype=float)
        s = np.array([rows[int(k)] for k in sorted(rows)], dtype=float)
        if len(b) == 1:
            return float(s[0] * batch / b[0])
        slope, icept = np.polyfit(b, s, 1)
        return float(max(icept + slope * batch, s.min() * 0.5))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": NATIVE_VERSION,
            "world": self.world,
            "allreduce": list(self.allreduce),
            "strategy_overhead": self.strategy_overhead,
            "tensorflow": self.tensorflow,
            "fit_error": self.fit_error,
            "local": {k: {str(b): s for b, s in sorted(v.items())} for k, v in sorted(self.local.items())},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NativeParams:
        try:
            return cls(
                int(d["world"]),
                (float(d["allreduce"][0]), float(d["allreduce"][1])),
                float(d["strategy_overhead"]),
                {str(k): {int(b): float(s) for b, s in v.items()} for k, v in (d.get("local") or {}).items()},
                d.get("tensorflow"),
                float(d.get("fit_error") or 0.0),
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise CalibrationError(
                f"cost model JSON: malformed 'native' ({exc}); measure it again with "
                "lab.calibrate(backend='tensorflow')"
            ) from None


def fit_native(
    ranks: list[dict[str, Any]],
    reference: tuple[str, int, int],
    keys: dict[str, str],
    tensorflow: str | None = None,
) -> NativeParams:
    """NativeParams from every rank's bench line (native_tf/child.py: bench): per size and per step the
    slowest rank's median. ``reference``: (its name, its batch, its gradient bytes); ``keys``:
    a measured model's name -> its compute.model_key."""
    from distlab.costmodel.calibrate import fit_alpha_beta

    world = len(ranks)

    def slowest(kind: str) -> dict[tuple[Any, ...], float]:
        out: dict[tuple[Any, ...], float] = {}
        for r in ranks:
            for *what, seconds in r[kind]:
                out[tuple(what)] = max(out.get(tuple(what), 0.0), float(seconds))
        return out

    reduce = slowest("allreduce")
    sizes = np.array([k[0] for k in reduce], dtype=float)
    seconds = np.array(list(reduce.values()), dtype=float)
    alpha, beta, err = fit_alpha_beta(np.full(len(sizes), world, dtype=float), sizes, seconds, "allreduce")
    local, mirrored = slowest("local"), slowest("mirrored")
    name, batch, grad_bytes = reference
    wire = float(collective_time("allreduce", world, grad_bytes, alpha, beta))
    overhead = max(mirrored[(name, batch)] - local[(name, batch)] - wire, 0.0)
    steps: dict[str, dict[int, float]] = {}
    for (model, b), s in local.items():
        if model in keys:
            steps.setdefault(keys[model], {})[int(b)] = s
    return NativeParams(world, (alpha, beta), overhead, steps, tensorflow, err)


def predict_native(
    native: NativeParams, cm: CostModel, profile: ModelProfile, resources: ResourceSpec, strategy: Strategy
) -> Prediction | None:
    """A native AllReduce run's step on ``strategy.world`` ranks (None for other builders and
    for a world other than the one measured: TensorFlow's figures are taken at the Lab's size)."""
    from distlab.costmodel.compute import model_key

    if getattr(strategy, "builder", None) != "AllReduce" or strategy.world != native.world:
        return None
    b = strategy.batch.per_replica
    local = native.local_step(model_key(profile), b)
    measured = local is not None
    if local is None:  # the torch-runtime model's compute and optimizer for it
        torch_side = cm.predict(profile, resources, strategy)
        local = torch_side.breakdown["compute"] + torch_side.breakdown["optimizer"]
    grad_bytes = sum(float(v.nbytes) for v in profile.variables if getattr(v, "trainable", True))
    wire = float(collective_time("allreduce", strategy.world, grad_bytes, *native.allreduce))
    step = local + wire + native.strategy_overhead
    gb = b * strategy.world
    return Prediction(
        basis=MEASURED_STEP,  # the model's native step, measured by the calibration
        strategy=f"{strategy.name} (tensorflow)",
        world=strategy.world,
        global_batch=gb,
        step_time=step,
        throughput=gb / step,
        breakdown={"compute": local, "comm": wire + native.strategy_overhead, "optimizer": 0.0},
        detail={
            "allreduce": wire,
            "strategy_overhead": native.strategy_overhead,
            "native_local_measured": float(measured),
        },
    )
