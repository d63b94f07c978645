"""The driver's side of ``Lab.run(train)``: see what the user's loop trains, plan the strategy for it,
predict it and build its ``Run``.

``train(ctx)`` runs once in the kernel up to its ``ctx.prepare(model, optimizer, loader)`` (a
``PlanContext``, whose ``prepare`` stops it there): what it prepares is what the strategy is built
for (the model's variables, the loader's batch) and what the card predicts, as Keras builds a
model on its first batch. The ranks then run ``train`` to its end (runtime/own_session.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from distlab.errors import DistlabError, LaunchError
from distlab.torch_route import TorchRoute


class _Planned(BaseException):
    """``ctx.prepare`` reached in the kernel: what it was given (a BaseException: the user's own
    ``except Exception`` does not stop the planning)."""

    def __init__(self, model: Any, optimizer: Any, loader: Any, scheduler: Any) -> None:
        super().__init__("planned")
        self.model, self.optimizer, self.loader, self.scheduler = model, optimizer, loader, scheduler


class PlanContext:
    """What ``train(ctx)`` sees in the kernel while ``lab.run`` plans: rank 0 of ``world``, on the CPU;
    ``prepare`` ends the planning; nothing communicates."""

    rank, device, is_main, step, epoch, stopping = 0, "cpu", True, 0, 0, False

    def __init__(self, world: int) -> None:
        self.world = world

    def prepare(self, model: Any, optimizer: Any, loader: Any, scheduler: Any = None) -> tuple[Any, Any, Any]:
        raise _Planned(model, optimizer, loader, scheduler)

    def accumulate(self) -> Any:
        return nullcontext()

    def epochs(self, n: int) -> Iterator[int]:
        return iter(range(n))

    def state(self, name: str, obj: Any) -> Any:
        return obj

    def report(self, **scalars: Any) -> None:
        pass

    def barrier(self) -> None:
        pass

    def all_reduce(self, t: Any, op: str = "mean") -> Any:
        return t


@dataclass
class Planned:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    scheduler: Any


def plan_loop(train: Any, world: int) -> Planned:
    """``train``'s model, optimizer and loader, from running it in the kernel up to ``ctx.prepare``."""
    if not callable(train):
        raise LaunchError(f"lab.run: train is a {type(train).__name__}; pass your function train(ctx)")
    if isinstance(train, torch.nn.Module):  # callable, but lab.launch's argument
        raise LaunchError(
            f"lab.run: train is a model ({type(train).__name__}); pass your function train(ctx), or train "
            "the model with distlab's loop: lab.launch(model, ...)"
        )
    try:
        inspect.signature(train).bind(None)
    except TypeError:
        raise LaunchError(
            f"lab.run: {getattr(train, '__name__', 'train')} must take one argument, the TrainContext "
            "(def train(ctx): ...)"
        ) from None
    except ValueError:  # a builtin without a signature: let the call say
        pass
    try:
        train(PlanContext(world))
    except _Planned as p:
        from distlab.runtime.own_checks import check_loader, check_optimizer

        if not isinstance(p.model, torch.nn.Module):
            raise LaunchError(
                f"ctx.prepare: model is a {type(p.model).__name__}; pass your torch.nn.Module"
            ) from None
        if not isinstance(p.optimizer, torch.optim.Optimizer):
            raise LaunchError(
                f"ctx.prepare: optimizer is a {type(p.optimizer).__name__}; pass the torch.optim.Optimizer "
                "you built on model.parameters()"
            ) from None
        check_optimizer(p.model, p.optimizer)
        check_loader(p.loader)
        return Planned(p.model, p.optimizer, p.loader, p.scheduler)
    except DistlabError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise LaunchError(
            f"lab.run: train(ctx) raised {type(exc).__name__}: {first} "
            "in the kernel, before ctx.prepare (lab.run runs it there once, up to ctx.prepare, to see what "
            "it trains); fix it and run again"
        ) from exc
    raise LaunchError(
        "lab.run: train(ctx) returned without calling ctx.prepare(model, optimizer, loader); prepare them "
        "before the loop, so the strategy is planned for them"
    )


class OwnLoopRoute(TorchRoute):
    """The torch route for a user's loop: its ranks run ``job.train_fn`` (runtime/trainer.py)."""

    name = "torch"

    def __init__(self, no_forecast: str = "") -> None:
        self._why = no_forecast

    def no_prediction(self, run: Any) -> str:
        return self._why or super().no_prediction(run)


def sample_batch(loader: Any, n: int) -> Any:
    """The loader's first ``n`` samples, collated as a rank collates them."""
    from torch.utils.data import default_collate

    data = loader.dataset
    collate = getattr(loader, "collate_fn", None) or default_collate
    return collate([data[i] for i in range(min(n, len(data)))])


def loop_profile(model: torch.nn.Module, loader: Any) -> Callable[[int | None], Any]:
    """``profile(n)``: the model's profile at per-replica batch ``n`` on the loader's batch (the
    model's input: a dict's entries as keyword arguments, the first of a pair, or the tensor);
    raises what the profiler raised when the model cannot be run that way."""
    from distlab.runs.prepare import profile_at

    cache: dict[int, Any] = {}
    hint = int(loader.batch_size)

    def profile(n: int | None = None) -> Any:
        n = n or hint
        if n not in cache:
            batch = sample_batch(loader, n)
            if isinstance(batch, dict) or hasattr(batch, "keys"):
                cache[n] = profile_at(KeywordModel(model, list(batch.keys())), n, tuple(batch.values()))
            else:
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                cache[n] = profile_at(model, n, x)
        return cache[n]

    return profile


class KeywordModel(torch.nn.Module):
    """``model(**batch)`` as a module of positional tensors, with the model's own variable names (its
    modules, parameters and buffers shared): what the profiler calls. An output with a ``loss`` is
    its loss (the step a loop takes), else its ``logits``, else itself."""

    def __init__(self, model: torch.nn.Module, keys: list[str]) -> None:
        super().__init__()
        object.__setattr__(self, "_inner", model)
        self._modules, self._parameters, self._buffers = model._modules, model._parameters, model._buffers
        self._keys = keys

    def forward(self, *tensors: Any) -> Any:
        inner: Any = self._inner
        out = inner(**dict(zip(self._keys, tensors)))
        for name in ("loss", "logits"):
            value = getattr(out, name, None)
            if value is None and isinstance(out, dict):
                value = out.get(name)
            if torch.is_tensor(value):
                return value
        return out


OWN_OPTIONS = ("slowdown", "jitter", "metrics")  # lab.run's options beyond its named arguments


def own_options(options: dict[str, Any]) -> tuple[Any, ...]:
    """``lab.run``'s ``**options`` as ``launch_own``'s last arguments; one error naming an unknown one."""
    if unknown := sorted(set(options) - set(OWN_OPTIONS)):
        raise LaunchError(
            f"lab.run: unknown option {unknown[0]!r}; it takes {', '.join(OWN_OPTIONS)} (as lab.launch does)"
        )
    return tuple(options.get(k) for k in OWN_OPTIONS)


def launch_own(
    lab: Any,
    train: Any,
    strategy: Any,
    workers: int | None,
    timeout: float | None,
    seed: int,
    elastic: bool,
    trace: bool,
    checkpoint_every: int | None,
    slowdown: Any = None,
    jitter: Any = None,
    metrics: Any = None,
) -> Any:
    """The ``Run`` of ``train`` on ``lab`` (a ``LabSide``): planned, predicted, not started.
    ``slowdown``, ``jitter``: as ``lab.launch``'s (a slowed run is not predicted); ``metrics``:
    names of ``distlab.step_metrics.METRICS``, each a ``run.metrics`` column measured on every
    step's output and target before the update (``own_metrics``)."""
    # Long because it is lab.launch's torch route for a loop that is the user's: the plan from the
    # kernel's run up to prepare, the strategy and prediction for it, then the same Run
    from distlab.conventions import optimizer_kind
    from distlab.data import describe
    from distlab.runs import validate as _v
    from distlab.runs.forecast import forecast_run
    from distlab.runs.run import Run
    from distlab.runtime.job import RankJob, RunOptions
    from distlab.torch_route import CHECKPOINT_BUDGET, adaptive_run_options, replanner

    res = lab.cluster.resources
    if workers is not None:
        workers = _v.check_positive("workers", workers)
        if workers > res.world:
            raise LaunchError(
                f"workers: {workers}, but the Lab has {res.world}; pass workers={res.world} or fewer"
            )
        res = res.first(workers)
    stragglers, jitter = _v.check_slowdown(slowdown), _v.check_jitter(jitter)
    _v.check_slowdown_ranks(stragglers, res.world)
    step_metrics = own_metrics(metrics)
    plan = plan_loop(train, res.world)
    model, loader = plan.model, plan.loader
    b = int(loader.batch_size)
    profile_fn = loop_profile(model, loader)
    why = ""
    try:
        profile = profile_fn(b)
    except Exception as exc:  # noqa: BLE001 - a forward distlab cannot call: planned from variables alone
        profile = _v.variables_profile(model)
        why = (
            f"none: the model could not be profiled on the loader's batch ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); the strategy was planned from its "
            "variables"
        )
        profile_fn = lambda n=None: profile  # noqa: E731
    record = getattr(lab.profiles, "record", None)  # the Lab's ProfileTap (sched/lab_pricing.py)
    if record is not None and not why:  # as a launch's: a shared Lab's scheduler prices the run with it
        record(b, profile)  # (without it a loop was priced by its measurements alone)
    user_opt: Any = plan.optimizer
    # the defaults as a group, not keywords: they hold keys the class's __init__ does not take
    # (AdamW's decoupled_weight_decay)
    opt_factory = lambda params: type(user_opt)([{"params": list(params), **user_opt.defaults}])  # noqa: E731
    st, _ = _v.resolve_strategy(strategy, model, res, profile_fn, batch_size=b)
    _v.check_strategy_fits(st, model, res.world, opt_factory)
    _v.check_global_batch(len(loader.dataset), b, st.batch.accumulation, st.world)
    kind = optimizer_kind(opt_factory)
    cost_model = lab.cost_model()
    # a slowed run is not predicted (nor refitted on: its slowness was asked for), as lab.launch's
    slowed = bool(stragglers or jitter)
    forecast = None if why or slowed else forecast_run(cost_model, profile, res, st, kind)
    run_id = lab.hooks.new_id()
    every, budget = checkpoint_every, None
    if elastic and every is None:
        every, budget = 10, CHECKPOINT_BUDGET
    from torch.utils.data import RandomSampler

    job = RankJob.unplaced(
        st,
        model,
        0,
        loader.dataset,
        batch_size=b,
        shuffle=isinstance(getattr(loader, "sampler", None), RandomSampler),
        seed=seed,
        checkpoint_dir=str(lab.checkpoint_dir / run_id) if every else None,
        checkpoint_every=every,
        checkpoint_budget=budget,
        timeout=float(timeout or lab.cluster.timeout),
        run_id=run_id,
        # an AdaptiveBatch strategy's controller table, as lab.launch's (none without a profile)
        options=RunOptions(
            # torch's DDP reducer fails on a variable the step leaves without a gradient: where the
            # profile saw one (or could not run the model), distlab's buckets, which take any
            ddp=not why and not profile.meta.get("no_gradient"),
            trace=bool(trace),
            slowdown=stragglers,
            jitter=jitter,
            metrics=step_metrics,
            **({} if why else adaptive_run_options(cost_model, profile, res, st, b, kind)),
        ),
        train_fn=train,
    )

    hosts = lab.cluster.first(st.world, res)
    run = Run(
        lab.hooks,
        run_id,
        model,
        st,
        job,
        hosts,
        lab.cluster.threads_for(hosts, res),
        route=OwnLoopRoute(why),
        elastic=elastic,
        replan=replanner(lab, job, st, model, lambda: profile, kind),
        forecast=forecast,
        data_info=describe(loader.dataset),
        loss_info=f"what {getattr(train, '__name__', 'train')}(ctx) minimises (your loop)",
    )
    run.optimizer_info = f"{type(user_opt).__name__} (your loop's)"
    return run


def own_metrics(metrics: Any) -> tuple[Any, ...]:
    """``lab.run(metrics=[...])``: names of the metrics distlab computes per step
    (``distlab.step_metrics.METRICS``: ``"accuracy"``, ``"mean_absolute_error"`` ...) or
    ``StepMetric`` objects, as ``StepMetric``s; one error naming an unknown one."""
    from distlab.step_metrics import METRICS, StepMetric

    if metrics is None:
        return ()
    if isinstance(metrics, (str, StepMetric)):
        metrics = [metrics]
    out: list[StepMetric] = []
    for m in metrics:
        if isinstance(m, str) and m.lower() in METRICS:
            m = StepMetric(m.lower())
        if not isinstance(m, StepMetric):
            raise LaunchError(
                f"metrics: {m!r} is not one distlab computes per step; name them from {', '.join(METRICS)}, "
                "or ctx.report(name=value) your own"
            )
        if m not in out:
            out.append(m)
    return tuple(out)
