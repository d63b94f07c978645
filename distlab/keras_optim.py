"""Keras 3's optimizers as torch optimizers: their settings and Keras's update rules, step for step.

torch's own optimizers differ from Keras's in small places that matter when gradients are small:
Keras's Adam adds epsilon to ``sqrt(v)`` before the bias correction (torch after it), Keras's
RMSprop and Adagrad divide by ``sqrt(v + epsilon)`` (torch by ``sqrt(v) + epsilon``), and Keras
applies ``weight_decay`` to every optimizer as a decoupled step ``var -= var * wd * lr`` before the
update (torch's Adam, RMSprop and Adagrad add ``wd * var`` to the gradient instead). So
:class:`KerasOptimizer` implements Keras's ``BaseOptimizer.apply`` for the optimizers
:mod:`distlab.conventions` carries: weight decay, then the kind's ``update_step`` (keras/src/optimizers:
adam.py, sgd.py, rmsprop.py, adagrad.py; AdamW is Adam with a weight-decay default).
"""

from __future__ import annotations

from typing import Any

import torch

# optimizer kind -> (Keras class, the Keras settings both routes carry, with Keras's defaults);
# weight_decay is Keras's decoupled decay (var -= var * wd * lr before the update), on every kind
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "adam": (
        "Adam",
        {
            "learning_rate": 1e-3,
            "beta_1": 0.9,
            "beta_2": 0.999,
            "epsilon": 1e-7,
            "amsgrad": False,
            "weight_decay": None,
        },
    ),
    "adamw": (
        "AdamW",
        {
            "learning_rate": 1e-3,
            "beta_1": 0.9,
            "beta_2": 0.999,
            "epsilon": 1e-7,
            "amsgrad": False,
            "weight_decay": 0.004,
        },
    ),
    "sgd": ("SGD", {"learning_rate": 0.01, "momentum": 0.0, "nesterov": False, "weight_decay": None}),
    "rmsprop": (
        "RMSprop",
        {
            "learning_rate": 1e-3,
            "rho": 0.9,
            "momentum": 0.0,
            "epsilon": 1e-7,
            "centered": False,
            "weight_decay": None,
        },
    ),
    "adagrad": (
        "Adagrad",
        {"learning_rate": 1e-3, "initial_accumulator_value": 0.1, "epsilon": 1e-7, "weight_decay": None},
    ),
}
# the settings each kind's update reads besides the rate and the decay
KINDS = {
    kind: tuple(k for k in settings if k not in ("learning_rate", "weight_decay"))
    for kind, (_, settings) in OPTIMIZERS.items()
}


class KerasOptimizer(torch.optim.Optimizer):
    """A Keras optimizer of ``kind`` with Keras's ``settings`` (``learning_rate``, ``weight_decay``
    and the kind's own), stepping torch parameters as Keras steps its variables. Sparse gradients
    (an ``nn.Embedding(sparse=True)`` table) are made dense first: Keras updates a whole table."""

    def __init__(self, params: Any, kind: str, settings: dict[str, Any]) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: one of {', '.join(KINDS)}")
        self.kind = kind
        defaults: dict[str, Any] = {
            "lr": float(settings["learning_rate"]),
            "weight_decay": settings.get("weight_decay"),
            **{k: settings[k] for k in KINDS[kind]},
        }
        if kind in ("adam", "adamw"):
            # what distlab.adaptive.scaling reads to know an Adam-like optimizer
            defaults["betas"] = (float(settings["beta_1"]), float(settings["beta_2"]))
        super().__init__(params, defaults)

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)  # Keras's ``iterations``
            z = torch.zeros_like(p, memory_format=torch.preserve_format)
            if self.kind in ("adam", "adamw"):
                state["m"], state["v"] = z.clone(), z.clone()
                if group["amsgrad"]:
                    state["v_hat"] = z.clone()
            elif self.kind == "sgd" and group["momentum"]:
                state["m"] = z.clone()
            elif self.kind == "rmsprop":
                state["velocity"] = z.clone()
                if group["momentum"] > 0:
                    state["m"] = z.clone()
                if group["centered"]:
                    state["average_grad"] = z.clone()
            elif self.kind == "adagrad":
                state["accumulator"] = torch.full_like(p, float(group["initial_accumulator_value"]))
        return state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = float(group["lr"]), group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:  # Keras filters empty gradients: no decay, no update
                    continue
                sparse = p.grad.is_sparse
                g = (p.grad.to_dense() if sparse else p.grad).to(p.dtype)
                state = self._state(p, group)
                state["step"] += 1
                if wd is not None:  # keras base_optimizer._apply_weight_decay, before the update
                    if sparse:
                        # runtime/ps.py sends the rows a server's step changed, read from the
                        # optimizer state: decay changes every nonzero row, not only the gradient's
                        state["decayed"] = p * (float(wd) * lr)
                    p.add_(p, alpha=-(float(wd) * lr))  # var - var * wd * lr
                _UPDATES[self.kind](p, g, lr, group, state)
        return loss


# The updates below are Keras's formulas written with torch's fused in-place ops (lerp_, addcmul_,
# addcdiv_): the same arithmetic up to float32 rounding, at about the cost of torch's own optimizers.


def _adam(p: torch.Tensor, g: torch.Tensor, lr: float, group: dict, state: dict) -> None:
    # keras/src/optimizers/adam.py update_step: epsilon added to sqrt(v), the corrections in alpha
    t = float(state["step"])
    b1, b2 = float(group["beta_1"]), float(group["beta_2"])
    alpha = lr * (1 - b2**t) ** 0.5 / (1 - b1**t)
    m, v = state["m"], state["v"]
    m.lerp_(g, 1 - b1)  # m + (g - m) * (1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)  # v + (g^2 - v) * (1 - b2)
    if group["amsgrad"]:
        torch.maximum(state["v_hat"], v, out=state["v_hat"])
        v = state["v_hat"]
    p.addcdiv_(m, v.sqrt().add_(float(group["epsilon"])), value=-alpha)


def _sgd(p: torch.Tensor, g: torch.Tensor, lr: float, group: dict, state: dict) -> None:
    # keras/src/optimizers/sgd.py update_step: the velocity holds -lr * gradient terms
    momentum = float(group["momentum"])
    if not momentum:
        p.add_(g, alpha=-lr)
        return
    m = state["m"]
    m.mul_(momentum).add_(g, alpha=-lr)
    if group["nesterov"]:
        p.add_(m, alpha=momentum).add_(g, alpha=-lr)
    else:
        p.add_(m)


def _rmsprop(p: torch.Tensor, g: torch.Tensor, lr: float, group: dict, state: dict) -> None:
    # keras/src/optimizers/rmsprop.py update_step: divides by sqrt(v + epsilon)
    rho, eps = float(group["rho"]), float(group["epsilon"])
    v = state["velocity"]
    v.mul_(rho).addcmul_(g, g, value=1 - rho)
    if group["centered"]:
        a = state["average_grad"]
        a.mul_(rho).add_(g, alpha=1 - rho)
        root = torch.addcmul(v, a, a, value=-1).add_(eps).sqrt_()  # sqrt(v - a^2 + eps)
    else:
        root = v.add(eps).sqrt_()
    if group["momentum"] > 0:
        m = state["m"]
        m.mul_(float(group["momentum"])).addcdiv_(g, root, value=lr)
        p.sub_(m)
    else:
        p.addcdiv_(g, root, value=-lr)


def _adagrad(p: torch.Tensor, g: torch.Tensor, lr: float, group: dict, state: dict) -> None:
    # keras/src/optimizers/adagrad.py update_step: divides by sqrt(accumulator + epsilon)
    acc = state["accumulator"]
    acc.addcmul_(g, g)
    p.addcdiv_(g, acc.add(float(group["epsilon"])).sqrt_(), value=-lr)


_UPDATES = {"adam": _adam, "adamw": _adam, "sgd": _sgd, "rmsprop": _rmsprop, "adagrad": _adagrad}
