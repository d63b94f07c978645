"""The user's library's conventions for what a run minimises and how it steps.

A Keras user passes Keras losses (an object, a function or a name such as
``"sparse_categorical_crossentropy"``), Keras optimizers (an object or a name such as ``"adam"``)
and expects ``model.compile(optimizer=..., loss=...)`` to count; a torch user passes a callable
``(output, target)`` and an optimizer factory ``params -> torch.optim.Optimizer``. :func:`resolve`
turns either into what a route runs, before any worker starts:

- ``KerasLoss``: a Keras loss with Keras's semantics (called as ``loss(y_true, y_pred)``,
  ``from_logits``, probabilities normalised and clipped as Keras does, ``label_smoothing``,
  ``delta``), computed in torch on the torch route (so it runs whatever Keras backend the
  notebook imported) and rebuilt as the Keras loss itself in the TensorFlow child
  (``keras_names.loss_from_spec`` on ``KerasLoss.spec()``). Per-sample losses are averaged over
  every sample of the global batch.
- ``OptimizerSpec``: an optimizer by kind and Keras's settings (:data:`OPTIMIZERS`, weight decay
  included); on the torch route a torch optimizer that steps by Keras's own update rule
  (:meth:`OptimizerSpec.__call__`, :class:`distlab.keras_optim.KerasOptimizer`), natively the Keras
  optimizer rebuilt from the same settings (:meth:`OptimizerSpec.keras`).

The default optimizer is Adam at 1e-3 (Keras's own default; :data:`DEFAULT_OPTIMIZER`). Bad input
(an unknown loss or optimizer name, a Keras loss for a torch model, a torch loss for a native
TensorFlow run, a Keras optimizer setting no route carries: clipping, EMA, gradient accumulation,
``exclude_from_weight_decay``) is one ``LaunchError`` naming it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from distlab.errors import LaunchError
from distlab.keras_names import optimizer_from_spec
from distlab.keras_optim import OPTIMIZERS, KerasOptimizer

EPSILON = 1e-7  # keras.config.epsilon(): probabilities are clipped to [EPSILON, 1 - EPSILON]

# canonical Keras loss name -> (Keras class, options it takes)
KERAS_LOSSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sparse_categorical_crossentropy": ("SparseCategoricalCrossentropy", ("from_logits", "ignore_class")),
    "categorical_crossentropy": ("CategoricalCrossentropy", ("from_logits", "label_smoothing")),
    "binary_crossentropy": ("BinaryCrossentropy", ("from_logits", "label_smoothing")),
    "mean_squared_error": ("MeanSquaredError", ()),
    "mean_absolute_error": ("MeanAbsoluteError", ()),
    "huber": ("Huber", ("delta",)),
}
_ALIASES = {"mse": "mean_squared_error", "mae": "mean_absolute_error", "huber_loss": "huber"}
_ALIASES.update({cls.lower(): name for name, (cls, _) in KERAS_LOSSES.items()})

# Keras optimizer settings that change the update and that no route carries as Keras means them:
# setting -> (why, the fix), refused in one line (their Keras defaults are None or False)
_UNCARRIED = {
    "clipnorm": (
        "distlab's runtimes step each server's shard of a variable with its own optimizer, and "
        "TensorFlow's replicas clip their share before the all-reduce",
        "drop clipnorm",
    ),
    "clipvalue": (
        "TensorFlow's replicas clip their share of the gradient before the all-reduce",
        "drop clipvalue, or on backend='torch' clip in a factory params -> torch.optim.Optimizer",
    ),
    "global_clipnorm": (
        "distlab's runtimes step each server's shard with its own optimizer, and TensorFlow's "
        "replicas clip their share before the all-reduce",
        "drop global_clipnorm",
    ),
    "use_ema": (
        "fit writes the moving average into the weights when it ends; a run ends with the trained weights",
        "drop use_ema",
    ),
    "gradient_accumulation_steps": (
        "distlab steps on every global batch",
        "drop it and raise batch_size",
    ),
}


def _is_keras(obj: Any) -> bool:
    return any(c.__module__.split(".")[0] in ("keras", "tf_keras") for c in type(obj).__mro__) or (
        callable(obj) and str(getattr(obj, "__module__", "")).split(".")[0] in ("keras", "tf_keras")
    )


@dataclasses.dataclass(frozen=True)
class KerasLoss:
    """A Keras loss by canonical ``name`` and ``options``; ``loss(output, target)`` on torch tensors."""

    name: str
    options: tuple[tuple[str, Any], ...] = ()
    source: str = "argument"  # "argument" or "compile"

    @property
    def __name__(self) -> str:  # noqa: PLW3201 - the run card names a loss by its __name__
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options)
        return f"keras {self.name}({opts})" + (" from model.compile" if self.source == "compile" else "")

    def __call__(self, output: Any, target: Any) -> Any:
        import torch.nn.functional as F  # noqa: N812

        o = dict(self.options)
        logits = bool(o.get("from_logits", False))
        if self.name == "sparse_categorical_crossentropy":
            y = target.reshape(output.shape[:-1]).long()
            flat, y = output.reshape(-1, output.shape[-1]), y.reshape(-1)
            keep = y != o["ignore_class"] if o.get("ignore_class") is not None else None
            if keep is not None:
                flat, y = flat[keep], y[keep]
            logp = F.log_softmax(flat, -1) if logits else _log_probs(flat)
            return F.nll_loss(logp, y)
        if self.name == "categorical_crossentropy":
            y = _smooth(target.to(output.dtype), o.get("label_smoothing", 0.0), output.shape[-1])
            logp = F.log_softmax(output, -1) if logits else _log_probs(output)
            return -(y * logp).sum(-1).mean()
        y = target.to(output.dtype).reshape(output.shape) if target.numel() == output.numel() else target
        if self.name == "binary_crossentropy":
            y = _smooth(y, o.get("label_smoothing", 0.0), 2)
            if logits:
                return F.binary_cross_entropy_with_logits(output, y)
            p = output.clamp(EPSILON, 1 - EPSILON)
            return -(y * p.log() + (1 - y) * (1 - p).log()).mean()
        if self.name == "mean_squared_error":
            return F.mse_loss(output, y)
        if self.name == "mean_absolute_error":
            return F.l1_loss(output, y)
        return F.huber_loss(output, y, delta=float(o.get("delta", 1.0)))

    def spec(self) -> dict[str, Any]:
        """What the native route's TensorFlow child builds it from: plain data (unpickling
        distlab's own objects there imported torch), ``native_tf/child.py``'s ``keras_loss``."""
        return {"keras_loss": KERAS_LOSSES[self.name][0], "options": dict(self.options)}


def _log_probs(p: Any) -> Any:
    """log of probabilities as Keras takes them: normalised to sum 1, clipped to [eps, 1 - eps]."""
    return (p / p.sum(-1, keepdim=True)).clamp(EPSILON, 1 - EPSILON).log()


def _smooth(y: Any, amount: float, classes: int) -> Any:
    return y * (1 - amount) + amount / classes if amount else y


def is_keras_loss_name(name: str) -> bool:
    """``name`` names a Keras loss distlab carries (``"mse"``, ``"SparseCategoricalCrossentropy"``)."""
    return _ALIASES.get(name.lower(), name.lower()) in KERAS_LOSSES


def keras_loss(loss: Any, source: str = "argument") -> KerasLoss | None:
    """``loss`` as a :class:`KerasLoss` when it is a Keras loss name, object or function; None for
    anything else (a torch callable). An unknown name, or a Keras loss distlab cannot carry, is
    one ``LaunchError``."""
    if isinstance(loss, KerasLoss):
        return loss
    if isinstance(loss, str):
        name, options = _ALIASES.get(loss.lower(), loss.lower()), {}
    elif _is_keras(loss):
        raw = getattr(loss, "__name__", None) if not hasattr(loss, "get_config") else type(loss).__name__
        name = _ALIASES.get(str(raw).lower(), str(raw).lower())
        # Keras keeps some options only in the wrapped function's kwargs (Huber's delta)
        options = {
            **getattr(loss, "_fn_kwargs", {}),
            **(loss.get_config() if hasattr(loss, "get_config") else {}),
        }
    else:
        return None
    if name not in KERAS_LOSSES:
        known = ", ".join(sorted({*KERAS_LOSSES, *_ALIASES} - {c.lower() for c, _ in KERAS_LOSSES.values()}))
        raise LaunchError(
            f"loss: {loss!r} is not a Keras loss distlab carries; use one of: {known}, or pass a callable "
            "(output, target) -> loss"
        )
    taken = KERAS_LOSSES[name][1]
    kept = tuple((k, options[k]) for k in taken if k in options and options[k] not in (None, False, 0, 0.0))
    if name == "huber" and "delta" in options:
        kept = (("delta", float(options["delta"])),)
    return KerasLoss(name, kept, source)


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer by ``kind`` and Keras-style ``options``; ``spec(params)`` is the torch one."""

    kind: str
    options: tuple[tuple[str, Any], ...] = ()
    source: str = "argument"  # "argument", "compile" or "default"

    @property
    def settings(self) -> dict[str, Any]:
        return {**OPTIMIZERS[self.kind][1], **dict(self.options)}

    def describe(self) -> str:
        s = self.settings
        defaults = OPTIMIZERS[self.kind][1]
        changed = {k: v for k, v in self.options if k != "learning_rate" and defaults.get(k) != v}
        extra = "".join(f", {k}={v!r}" for k, v in changed.items())
        where = {"compile": " from model.compile", "default": " (distlab's default)"}.get(self.source, "")
        return f"{OPTIMIZERS[self.kind][0]}(learning_rate={s['learning_rate']:g}{extra}){where}"

    def __call__(self, params: Any) -> Any:
        return KerasOptimizer(params, self.kind, self.settings)

    def spec(self) -> dict[str, Any]:
        """What the native route's TensorFlow child builds it from (``keras_names.optimizer_from_spec``)."""
        return {"keras_optimizer": OPTIMIZERS[self.kind][0], "settings": self.settings}

    def keras(self) -> Any:
        """The Keras optimizer (the native route's), built where it runs."""
        import keras

        return optimizer_from_spec(keras, self.spec())


DEFAULT_OPTIMIZER = OptimizerSpec("adam", source="default")


def optimizer_spec(optimizer: Any, source: str = "argument", lr: float | None = None) -> OptimizerSpec | None:
    """``optimizer`` as an :class:`OptimizerSpec` when it is a name or a Keras optimizer (``lr``
    overrides its rate); None for a factory (a torch one, or a zero-argument Keras one natively)."""
    if isinstance(optimizer, OptimizerSpec):
        spec = optimizer
    elif isinstance(optimizer, str):
        kind = optimizer.lower()
        if kind not in OPTIMIZERS:
            raise LaunchError(
                f"optimizer: {optimizer!r} is not an optimizer name; use one of: {', '.join(OPTIMIZERS)}, "
                "a Keras optimizer, or a factory params -> torch.optim.Optimizer"
            )
        spec = OptimizerSpec(kind, source=source)
    elif _is_keras(optimizer) and hasattr(optimizer, "get_config"):
        spec = _from_keras(optimizer, source)
    else:
        return None
    if lr is not None:
        spec = dataclasses.replace(
            spec,
            options=(*[o for o in spec.options if o[0] != "learning_rate"], ("learning_rate", float(lr))),
        )
    return spec


def _from_keras(opt: Any, source: str) -> OptimizerSpec:
    kind = type(opt).__name__.lower()
    if kind not in OPTIMIZERS:
        raise LaunchError(
            f"optimizer: Keras {type(opt).__name__} is not one distlab carries ({', '.join(OPTIMIZERS)}); "
            "pass one of those, or a factory params -> torch.optim.Optimizer"
        )
    cfg = opt.get_config()
    name = type(opt).__name__
    for key, (why, fix) in _UNCARRIED.items():
        if cfg.get(key):  # None, False and 0 are Keras's "off"
            raise LaunchError(
                f"optimizer: {name}({key}={cfg[key]!r}) is not carried to distlab's runs ({why}); {fix}"
            )
    if getattr(opt, "_exclude_from_weight_decay", None) or getattr(
        opt, "_exclude_from_weight_decay_pattern", None
    ):
        raise LaunchError(
            f"optimizer: {name}.exclude_from_weight_decay(...) is not carried to distlab's runs (the "
            "decay would reach every variable); leave it out, or pass an optimizer without weight_decay"
        )
    lr = cfg.get("learning_rate")
    if not isinstance(lr, (int, float)):
        raise LaunchError(
            f"optimizer: {type(opt).__name__} has a learning-rate schedule ({type(lr).__name__}); distlab "
            "carries a constant rate: pass learning_rate=<float>, or a torch factory with a scheduler"
        )
    # loss_scale_factor is taken and left out: fit multiplies the loss by it and divides the
    # gradients by it before the update, the same update for a float32 model (resolve refuses it
    # for any other); distlab's routes compute the loss unscaled and divide nothing
    taken = OPTIMIZERS[kind][1]
    return OptimizerSpec(kind, tuple((k, cfg[k]) for k in taken if k in cfg), source)


@dataclasses.dataclass(frozen=True)
class Conventions:
    """What a launch runs: ``loss`` (a callable, a :class:`KerasLoss`, or None for the default),
    ``optimizer`` (an :class:`OptimizerSpec` or the user's factory) and the card's words for it."""

    loss: Any
    optimizer: Any
    optimizer_info: str
    metrics: tuple[Any, ...] = ()  # a compiled Keras model's (distlab.step_metrics)


def resolve(
    model: Any, loss: Any, optimizer: Any, backend: str = "torch", lr: float | None = None
) -> Conventions:
    """The loss and optimizer a launch of ``model`` runs: the arguments, else ``model.compile``'s
    (a Keras model), else the defaults (the loss for the targets; Adam at 1e-3). ``lr`` overrides
    the rate of a named, Keras or default optimizer. A compiled Keras model's metrics are reported
    per step (distlab.step_metrics)."""
    from distlab.keras_model import KerasModule, is_keras_model
    from distlab.step_metrics import step_metrics

    keras_model = is_keras_model(model) or isinstance(model, KerasModule)
    inner = getattr(model, "keras_model", model)
    lsource = osource = "argument"
    if loss is None and keras_model and getattr(inner, "loss", None) is not None:
        loss, lsource = inner.loss, "compile"
    if optimizer is None and keras_model and getattr(inner, "optimizer", None) is not None:
        optimizer, osource = inner.optimizer, "compile"
    kl = keras_loss(loss, lsource)
    _check_loss_scale(optimizer, inner)
    metrics = step_metrics(inner) if keras_model else ()
    if kl is not None and not keras_model:
        raise LaunchError(
            f"loss: a Keras loss ({kl.name}) for a torch model {type(model).__name__}; pass a torch callable "
            "(output, target) such as torch.nn.CrossEntropyLoss(), or leave loss=None for the default"
        )
    if backend == "tensorflow" and loss is not None and kl is None and _is_torch(loss):
        raise LaunchError(
            f"loss: a torch loss ({getattr(loss, '__name__', type(loss).__name__)}) for a native TensorFlow "
            "run; pass a Keras loss (an object or a name such as 'sparse_categorical_crossentropy')"
        )
    spec = DEFAULT_OPTIMIZER if optimizer is None else optimizer_spec(optimizer, osource)
    if spec is None:  # the user's factory
        if lr is not None:
            raise LaunchError(
                "lr: sets the rate of a named or Keras optimizer; set it in your factory instead"
            )
        if backend == "tensorflow" and isinstance(optimizer, type) and _is_torch(optimizer):
            raise LaunchError(
                f"optimizer: torch's {optimizer.__name__} for a native TensorFlow run; pass a Keras "
                "optimizer or a name ('adam', 'sgd')"
            )
        name = getattr(optimizer, "__name__", type(optimizer).__name__)
        return Conventions(kl or loss, optimizer, f"{name} (your factory)", metrics)
    if lr is not None:
        spec = optimizer_spec(spec, spec.source, lr)
    assert spec is not None
    return Conventions(kl or loss, spec, spec.describe(), metrics)


def _check_loss_scale(optimizer: Any, model: Any) -> None:
    """A Keras optimizer's ``loss_scale_factor`` is left out (:func:`_from_keras`), which is fit's
    update only when the model computes in float32: refuse it for any other dtype policy."""
    factor = getattr(optimizer, "loss_scale_factor", None) if _is_keras(optimizer) else None
    if not factor:
        return
    layers, policies = [model], []
    while layers:  # the model's and every nested layer's dtype policy
        layer = layers.pop()
        policies.append(getattr(getattr(layer, "dtype_policy", None), "name", "float32"))
        layers.extend(getattr(layer, "layers", []) or [])
    other = sorted({p for p in policies if p != "float32"})
    if other:
        raise LaunchError(
            f"optimizer: {type(optimizer).__name__}(loss_scale_factor={factor!r}) with layers of dtype "
            f"policy {', '.join(other)}: distlab's runs compute the loss unscaled; use float32 layers, "
            "or drop loss_scale_factor"
        )


def _is_torch(obj: Any) -> bool:
    mods = [c.__module__ for c in (obj.__mro__ if isinstance(obj, type) else type(obj).__mro__)]
    own = str(getattr(obj, "__module__", ""))
    return any(m.split(".")[0] == "torch" for m in mods) or own.split(".")[0] == "torch"


def optimizer_kind(optimizer: Any) -> str:
    """What a run's optimizer costs like to the cost model: ``"sgd"`` (no state), ``"momentum"``
    (one state tensor: momentum SGD, RMSprop, Adagrad) or ``"adam"`` (two: the Adam family). None
    is the runtime's own default, plain SGD; a factory is asked for an optimizer of one parameter."""
    if optimizer is None:
        return "sgd"
    if isinstance(optimizer, str):
        optimizer = optimizer_spec(optimizer)
    if isinstance(optimizer, OptimizerSpec):
        from distlab.costmodel.params import optimizer_kind as priced_as

        momentum = optimizer.kind == "sgd" and optimizer.settings["momentum"]
        return "momentum" if momentum else priced_as(optimizer.kind)
    try:
        made = optimizer([torch.nn.Parameter(torch.zeros(1))])
    except TypeError:
        try:
            made = optimizer()  # a native route's zero-argument Keras factory
        except Exception:  # noqa: BLE001 - unknown: priced as the launch default
            return "adam"
    except Exception:  # noqa: BLE001
        return "adam"
    name = type(made).__name__.lower()
    if "adam" in name:
        return "adam"
    if name == "sgd":
        groups = getattr(made, "param_groups", None)
        momentum = groups[0].get("momentum", 0.0) if groups else float(getattr(made, "momentum", 0.0) or 0.0)
        return "momentum" if momentum else "sgd"
    return "momentum"
