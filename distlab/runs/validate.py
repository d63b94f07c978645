"""Check a launch's inputs on the client, before any worker starts: each fault is one line with the fix."""

from __future__ import annotations

import copy
import os
import warnings
from typing import Any

from distlab import errors
from distlab.errors import DistlabError, LaunchError, StrategyError, did_you_mean, match_name
from distlab.resources import ResourceSpec
from distlab.runs.report import model_name
from distlab.strategy.types import Strategy


def check_positive(name: str, value: Any, *, optional: bool = False) -> int | None:
    """A launch's positive integer (errors.check_positive, as a ``LaunchError``)."""
    return errors.check_positive(name, value, LaunchError, optional=optional)


def check_model(model: Any) -> None:
    import torch

    if not isinstance(model, torch.nn.Module):
        raise LaunchError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise LaunchError("model: has no trainable parameters; there is nothing to train")


def variables_profile(model: Any) -> Any:
    """A profile of the model's trainable variables only (names, shapes, dtypes): no forward pass."""
    from distlab.profiling.model_profile import ModelProfile

    sparse = _sparse_params(model)
    rows = [
        (n, tuple(p.shape), str(p.dtype), n in sparse) for n, p in model.named_parameters() if p.requires_grad
    ]
    return ModelProfile.from_variables(rows, name=model_name(model))


def _sparse_params(model: Any) -> set[str]:
    import torch

    out = set()
    for mname, m in model.named_modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse:
            out.add(f"{mname}.weight" if mname else "weight")
    return out


def resolve_strategy(
    strategy: Any, model: Any, resources: ResourceSpec, profile_fn: Any, batch_size: int | None = None
) -> tuple[Strategy, Any]:
    """A Strategy from a Strategy, a builder name (built for ``batch_size`` per replica, when
    given) or a JSON path; returns it and the profile used, if any."""
    profile = None
    if isinstance(strategy, Strategy):
        st = strategy
    elif isinstance(strategy, (str, os.PathLike)):
        text = os.fspath(strategy)
        if os.path.exists(text) or text.endswith(".json"):
            st = Strategy.load(text)
        else:
            from distlab import strategy as strategies

            known = list(strategies.builders())
            name = match_name(text, known)
            if name is None:
                raise StrategyError(
                    f"strategy: builder {text!r} is not known{did_you_mean(text, known)} "
                    f"(one of: {', '.join(known)})"
                )
            text = name
            profile = profile_fn()
            st = strategies.build(
                text, profile, resources, **({"batch_size": batch_size} if batch_size else {})
            )
    else:
        raise LaunchError(
            f"strategy: expected a Strategy, a builder name or a JSON path, got {type(strategy).__name__}"
        )
    return st, profile


def check_strategy_fits(st: Strategy, model: Any, available: int, optimizer: Any = None) -> None:
    """The strategy plans exactly this model's variables (names and shapes), its batch settings
    run (with ``optimizer``, the launch's optimizer factory), and it fits the cluster."""
    from distlab.strategy import parse

    prof = variables_profile(model)
    try:
        parse.check(st, prof)
    except StrategyError as exc:
        raise StrategyError(f"strategy {st.name} does not fit model {model_name(model)}: {exc}") from None
    from distlab.adaptive import scaling

    scaling.check_rule(st.batch.lr_scaling, f"strategy {st.name}: batch.lr_scaling")
    if optimizer is not None and st.batch.lr_scaling != "none":
        scaling.check_optimizer(
            optimizer([p for p in model.parameters() if p.requires_grad]), st.batch.lr_scaling
        )
    check_world_fits(st, available)


def check_world_fits(st: Strategy, available: int) -> None:
    """The strategy's ranks fit the ``available`` workers (both routes ask)."""
    if st.world > available:
        raise LaunchError(
            f"strategy: planned for {st.world} ranks but the Lab has {available} workers; "
            "build it for lab.resources or start the Lab with more workers"
        )


def synthetic_data(model: Any, profile: Any, n: int, seed: int) -> Any:
    """data=None: a synthetic dataset shaped from the profile's input and target specs."""
    if profile is None or not getattr(profile, "input_spec", None):
        raise LaunchError(
            f"data: the profile of {model_name(model)} has no input shape to synthesise data from; pass "
            "data= (a Dataset of (input, target))"
        )
    from distlab.data import synthetic

    return synthetic(profile, n, seed)


def check_data(data: Any, model: Any, loss: Any, batch: int = 2) -> tuple[Any, Any]:
    """The dataset is map-style, non-empty, yields (input, target) pairs, and a batch of ``batch``
    samples (as a rank collates them; the input may be a tuple of tensors for a model of several
    inputs) trains a copy of the model in training mode. Returns that batch.

    A batch, not one sample: BatchNorm cannot train on one value per channel (a ResNet's 1x1
    final map), and the check runs the model as a rank will, at the per-replica batch.
    """
    import torch

    from distlab.data import DATA_FORMS, as_dataset
    from distlab.runtime.data import call_model, first_batch
    from distlab.runtime.trainer import default_loss, loss_name

    try:
        data = as_dataset(data)
    except DistlabError as exc:
        raise LaunchError(str(exc)) from None
    try:
        n = len(data)
    except TypeError:
        raise LaunchError(f"data: expected {DATA_FORMS}, got {type(data).__name__}") from None
    if n == 0:
        raise LaunchError("data: the dataset is empty")
    try:
        sample = data[0]
    except Exception as exc:  # noqa: BLE001 - a user's dataset can raise anything
        raise LaunchError(f"data[0]: cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(sample, (tuple, list)) or len(sample) != 2:
        raise LaunchError(
            f"data[0]: expected an (input, target) pair, got {type(sample).__name__}; give data as "
            f"{DATA_FORMS}, e.g. data=(X, y)"
        )
    try:
        x, y = first_batch(data, batch)
    except Exception as exc:  # noqa: BLE001
        raise LaunchError(
            f"data: the first {min(batch, n)} samples do not collate into a batch ({type(exc).__name__}: "
            f"{(str(exc).splitlines() or [''])[0][:200]}); give every sample the same shapes and types"
        ) from None
    probe = copy.deepcopy(model)
    probe.train()
    try:
        out = call_model(probe, x)
    except DistlabError:  # a Keras model's own distlab error says what it needs
        raise
    except Exception as exc:  # noqa: BLE001 - a user's model can raise anything
        raise LaunchError(
            f"data: a batch of {len(y)} samples (input {shapes_of(x)}) does not fit model "
            f"{model_name(model)}: {type(exc).__name__}: {_first_line(exc)}; make the dataset match "
            "the model's input"
        ) from None
    try:
        with warnings.catch_warnings(record=True) as caught:  # the library's, only if it computes
            warnings.simplefilter("always")
            value = (loss or default_loss)(out, y)
        for w in caught:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    except DistlabError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise LaunchError(
            f"loss: {loss_name(loss, y if torch.is_tensor(y) else None)} of the model's output "
            f"{shapes_of(out)} and a target {_described(y)} raised {type(exc).__name__}: "
            f"{_first_line(exc)}; give targets that loss takes, or pass loss= one that takes these"
        ) from None
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise LaunchError(
            f"loss: must return a scalar tensor, returned {type(value).__name__} of shape "
            f"{getattr(value, 'shape', '?')}"
        )
    return x, y


def check_global_batch(n: int, per_replica: int, accumulation: int, world: int) -> None:
    """A step reads ``per_replica * accumulation * world`` samples: no more than the data holds
    (more would put the same sample in one step's batch twice: a mistake, not a plan)."""
    per_step = per_replica * accumulation * world
    if per_step > n:
        fits = n // (accumulation * world)
        fix = f"batch_size={fits} or less" if fits else f"at least {accumulation * world} samples"
        raise LaunchError(
            f"batch_size: {per_replica} per replica x {accumulation} accumulation step(s) x {world} ranks is "
            f"{per_step:,} samples a step, more than the {n:,} in data (a step would read samples twice); "
            f"use {fix}, or more data"
        )


def check_loss(loss: Any) -> None:
    """``loss`` is None (the model's task decides) or a callable of (outputs, targets)."""
    if loss is not None and not callable(loss):
        raise LaunchError(
            f"loss: expected a callable (outputs, targets) -> scalar tensor such as "
            f"torch.nn.CrossEntropyLoss(), or None for the default; got {type(loss).__name__} {loss!r:.60}"
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0][:200]


def _described(y: Any) -> str:
    """A target batch for messages: its shape and dtype."""
    dtype = getattr(y, "dtype", None)
    return f"{shapes_of(y)} {str(dtype).replace('torch.', '')}" if dtype is not None else shapes_of(y)


def shapes_of(x: Any) -> str:
    """A batch input's shape, or the shapes of its tensors, for messages."""
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(shapes_of(t) for t in x) + ")"
    return str(list(getattr(x, "shape", ())))


def check_jitter(jitter: Any) -> float:
    """``lab.launch(jitter=σ)``: a finite number in [0, 5] (0.2: each rank's compute varies by 20%
    of its step), or one ``LaunchError``."""
    import math

    if jitter is None:
        return 0.0
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not math.isfinite(jitter):
        raise LaunchError(f"jitter: expected a number, e.g. 0.2 (20% of forward+backward), got {jitter!r}")
    if not 0 <= jitter <= 5:
        raise LaunchError(f"jitter: {jitter!r} must be between 0 and 5 (0.2: 20% of forward+backward)")
    return float(jitter)


def check_slowdown(slowdown: Any) -> tuple[tuple[int, float], ...]:
    """``lab.launch(slowdown={rank: factor})`` as ``(rank, factor)`` pairs, or one ``LaunchError``
    naming the entry: a rank is an integer >= 0 (whether it exists is checked against the
    strategy), a factor a finite number >= 1."""
    import math

    if not slowdown:
        return ()
    if not isinstance(slowdown, dict):
        raise LaunchError(
            f"slowdown: expected {{rank: factor}}, e.g. {{1: 1.5}}; got {type(slowdown).__name__}"
        )
    out = []
    for rank, factor in sorted(slowdown.items(), key=lambda kv: str(kv[0])):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise LaunchError(f"slowdown[{rank!r}]: a rank is an integer >= 0")
        if (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not math.isfinite(factor)
            or factor < 1
        ):
            raise LaunchError(
                f"slowdown[{rank}]: factor {factor!r} must be a number >= 1 "
                "(1.5: that rank computes 1.5x slower)"
            )
        out.append((rank, float(factor)))
    return tuple(out)


def check_slowdown_ranks(stragglers: Any, world: int) -> None:
    """Every slowed rank (``check_slowdown``'s pairs) exists in a run of ``world`` ranks, or one
    ``LaunchError`` naming the first that does not."""
    if bad := [rank for rank, _ in stragglers if rank >= world]:
        raise LaunchError(
            f"slowdown: rank {bad[0]} does not exist (the run has {world} ranks: 0-{world - 1})"
        )
