"""``dl.profile``: measure a torch model (variables, per-layer FLOPs and times, gradient-ready order) into a
ModelProfile.

Long because one profile is one pass over the model in order (inputs, hooks, timed steps, their
attribution) sharing _TorchProfiler's state; inputs are in torch_inputs.py and the meters in
torch_meter.py."""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from distlab.allocator import tune_allocator
from distlab.errors import ProfileError, check_positive
from distlab.profiling.model_profile import DEFAULT_BATCH, LayerProfile, ModelProfile, VariableProfile
from distlab.profiling.torch_inputs import Batch, diagnose, dtype_name, make_batcher
from distlab.profiling.torch_meter import ROOT, LayerMeter, ModuleAttribution, flat_tensors
from distlab.resources import available_cores, cpu_sample, disturbed_by, foreign_load

STEP_SECONDS = 1.5  # plain steps at batch_size stop once stable or after this long (at least MIN_STEPS)
FIT_SECONDS = 0.75  # the same for the second batch of the compute fit
MIN_STEPS, STABLE_STEPS, MAX_STEPS = 3, 5, 100  # timed steps per batch: least, least before "stable", most
STABLE_WITHIN = 0.02  # stable: the median moved less than this (relative) over the last two steps
SETTLE_SHARE = 0.2  # ... judged once this share of the budget is spent too: fast steps take more
METER_STEP_SECONDS = 0.25  # per-op metered passes run at batch_size if a plain step there is this fast
METER_SECONDS = 1.0  # metered passes stop after this long (at least one)
# above 1: more than linear in threads (caches); below 0: one thread faster than all of them, as
# when the cluster's own processes take turns on the cores (every thread of a step waits for the
# slowest at each op); beyond these bounds, noise
THREAD_EFFICIENCY_MIN, THREAD_EFFICIENCY_MAX = -1.0, 1.2


def profile(
    model: Any,
    sample_input: Any = None,
    batch_size: int = DEFAULT_BATCH,
    *,
    repeats: int = 3,
    warmup: int = 1,
    micro_batch: int | None = None,
    seed: int = 0,
) -> ModelProfile:
    """Profile ``model`` for one training step at ``batch_size``.

    ``sample_input``: a batch (tensor, or tuple of tensors for several inputs); it is tiled
    to the sizes profiled. It may be omitted for zoo models (they carry ``input_spec``) and
    for models whose first layer is Linear, Embedding or Conv with known channels.

    A step is forward plus backward, then the gradients are dropped. The backward runs through
    the runtime's default loss when the output is one tensor of class scores (cross-entropy over
    its last dimension: over a vocabulary it is a real share of the step), else from a gradient
    of ones on every trainable output.

    The profile is taken as a rank computes: under the glibc malloc thresholds every rank runs
    with (``allocator.py``; set in this process too), and, when this process runs
    several threads, the step is also timed on one thread (``meta["thread_steps"]``), so
    ``meta["thread_efficiency"]`` ``e`` says how this model's step scales with threads
    (``seconds(t) = step_time (T / t) ** e``; a rank gets fewer threads when ranks share the
    cores). Other programs' CPU use while it ran is ``meta["load"]`` (cores, from
    ``/proc/stat``); at a quarter of a core or 15% of the cores it is ``meta["disturbed"]``, and
    every prediction made from it says so.

    ``step_time`` is measured at ``batch_size`` itself, never scaled from another batch: it
    is the median of plain steps (no hooks, no per-op timing) taken after ``warmup`` untimed
    passes (at least one: the first pass, which carries hooks to check the model and record
    the gradient-ready order, always runs and counts as one). Steps are repeated until their
    median moves less than 2% over the last two steps (judged once at least 5 steps and
    0.3 s are spent) or 1.5 s is spent, with at least ``max(3, repeats)`` and at most 100
    steps (``meta["step_time_method"]``, ``meta["step_repeats"]``; ``meta["time_batch"]`` is
    ``batch_size``).

    Compute as a function of the batch: plain steps are timed the same way at a second
    batch, after one untimed pass there (none if ``warmup=0``) and with half the time (0.75 s
    at most, stability judged after 0.15 s). The second batch is ``batch_size // 2``, at
    least 2 for models with BatchNorm, or ``2 * batch_size`` where that is not below
    ``batch_size``. ``seconds = alpha + beta * batch`` is fitted through the two medians
    (``meta["step_fit"]``: ``alpha``, ``beta``, ``batches`` and ``seconds``, batch_size
    first); a negative ``alpha`` becomes 0 with ``beta = step_time / batch_size``, a negative
    ``beta`` becomes 0 with ``alpha = step_time``. :meth:`ModelProfile.compute_time_at` uses it.

    Per-layer times are shares of ``step_time``: ``repeats`` passes (fewer once they have
    taken 1 s) time every aten op under a dispatch mode and attribute it to its layer; per
    layer and phase the median is taken and scaled so that all add up to ``step_time``
    (``meta["layer_time_scale"]``): the metering's own per-op cost skews the shares towards
    layers of many small ops, but is not added to any time. These passes run at
    ``batch_size`` when a plain step there takes at most 0.25 s, else at the largest batch
    the fit puts at 0.25 s or less, or at ``micro_batch`` when given; never above
    ``batch_size``, nor below 2 for models with BatchNorm unless ``batch_size`` is 1
    (``meta["meter_batch"]``, ``meta["meter_passes"]``).

    FLOPs and activation bytes are exact at ``batch_size``: they are counted on fake tensors
    (shapes only, no arithmetic). Where fake tensors cannot run the model, the first metered
    pass's count is scaled linearly to ``batch_size`` (``meta["flops_method"]``).

    The model's training mode, gradients, buffers and the global RNG state are restored.
    """
    # Long because its docstring is dl.profile's reference; the work is in _TorchProfiler
    from distlab.keras_model import KerasModule

    if isinstance(model, KerasModule):  # a Keras model as the runtime runs it: profiled as Keras
        model = model.keras_model
    if _is_keras(model):
        from distlab.profiling.keras_profiler import profile_keras

        return profile_keras(model, sample_input, batch_size, repeats=repeats, warmup=warmup)
    if not isinstance(model, nn.Module):
        raise ProfileError(f"profile: expected a torch nn.Module or keras.Model, got {type(model).__name__}")
    for label, value, low in (("batch_size", batch_size, 1), ("repeats", repeats, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ProfileError(f"profile: {label} must be an integer >= {low}, got {value!r}")
    check_positive("profile: micro_batch", micro_batch, ProfileError, optional=True)
    if not any(p.requires_grad for p in model.parameters()):
        raise ProfileError(
            f"profile: {type(model).__name__} has no trainable parameters, so there is nothing to "
            "distribute; pass a model with parameters (requires_grad=True)"
        )
    tune_allocator()  # glibc's thresholds as every rank runs with them (allocator.py)
    started, cpu = time.perf_counter(), cpu_sample()
    with _preserved(model):
        prof = _TorchProfiler(model, sample_input, batch_size, repeats, warmup, micro_batch, seed).run()
    prof.meta["profile_seconds"] = time.perf_counter() - started
    foreign = foreign_load(cpu)
    if foreign is not None:
        prof.meta["load"] = {"foreign": foreign, "cores": available_cores()}
        prof.meta["disturbed"] = disturbed_by(foreign, available_cores())
    return prof


def _is_keras(model: Any) -> bool:
    roots = {c.__module__.split(".")[0] for c in type(model).__mro__}
    if not roots & {"keras", "tensorflow", "tf_keras"}:
        return False
    try:
        import keras  # noqa: F401
    except ImportError:
        raise ProfileError(
            f"profile: {type(model).__name__} is a Keras model but Keras is not installed; pip install "
            "distlab[tf]"
        ) from None
    return True


@contextmanager
def _preserved(model: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in model.modules()]
    grads = [(p, p.grad) for p in model.parameters()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        try:
            for p, _ in grads:
                p.grad = None
            model.train()
            yield
        finally:
            for m, mode in modes:
                m.training = mode
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            for p, g in grads:
                p.grad = g


class _TorchProfiler:
    def __init__(self, model, sample_input, batch_size, repeats, warmup, micro_batch, seed) -> None:
        self.model = model
        self.batch_size = batch_size
        self.repeats = repeats
        self.warmup = warmup
        self.micro_batch = micro_batch
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.device = self.params[0][1].device
        self.cuda = self.device.type == "cuda"
        self.modules = [(n or ROOT, m) for n, m in model.named_modules()]
        self.by_name = dict(self.modules)
        # Owning layer of each parameter: the module that registers it (first one, if shared).
        self.owner: dict[str, str] = {}
        ids = {id(p): n for n, p in self.params}
        for mname, mod in self.modules:
            for p in mod.parameters(recurse=False):
                if id(p) in ids:
                    self.owner.setdefault(ids[id(p)], mname)
        self.batch, self.input_spec, self.inferred = make_batcher(model, sample_input, self.device, seed)
        self.exec_order: list[str] = []
        self.lookups: dict[str, float] = {}

    # -- passes ------------------------------------------------------------------------------
    def _attribution(self, params: dict[str, torch.Tensor] | None = None) -> ModuleAttribution:
        tensors = params if params is not None else dict(self.params)
        return ModuleAttribution(self.modules, {id(t): self.owner[n] for n, t in tensors.items()})

    def _backward(self, out: Any) -> None:
        """Backward from every trainable floating-point output: through the default loss when the
        output is one tensor of class scores (cross-entropy over its last dimension, as the runtime
        trains it on integer targets: over a vocabulary of thousands it is a real share of the
        step), else a ones gradient each."""
        outs = [t for t in flat_tensors(out) if t.requires_grad and t.is_floating_point()]
        if not outs:
            raise ProfileError(
                f"forward: the output of {type(self.model).__name__} does not depend on its trainable "
                "parameters; profile the module whose output is trained"
            )
        if len(outs) == 1 and outs[0].dim() >= 2 and outs[0].shape[-1] >= 2:
            scores = outs[0].reshape(-1, outs[0].shape[-1])
            target = torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)
            torch.nn.functional.cross_entropy(scores, target).backward()
            return
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])

    def _step(
        self, args: Batch, call: Callable[[Batch], Any] | None = None, grads: list[torch.Tensor] | None = None
    ) -> None:
        self._backward(call(args) if call else self.model(*args))
        for p in grads if grads is not None else [p for _, p in self.params]:
            p.grad = None

    def _checked_step(self, m: int) -> tuple[float, list[str]]:
        """First pass: diagnose a failing forward, record the gradient-ready order."""
        attr = self._attribution()
        attr.track_nodes, attr.keep_inputs = False, True
        order: list[str] = []
        handles = attr.attach()
        handles += [
            p.register_post_accumulate_grad_hook(lambda _p, n=n: order.append(n)) for n, p in self.params
        ]
        stage = "forward"
        try:
            t0 = time.perf_counter()
            args = self.batch(m)
            out = self.model(*args)
            stage = "backward"
            self._backward(out)
            for _, p in self.params:
                p.grad = None
            elapsed = time.perf_counter() - t0
        except ProfileError:
            raise
        except Exception as exc:  # the user's forward/backward failed: name the layer
            raise ProfileError(self._explain(attr, stage, exc)) from None
        finally:
            for h in handles:
                h.remove()
        for name, args in attr.inputs.items():
            self.exec_order.append(name)
            if isinstance(self.by_name[name], (nn.Embedding, nn.EmbeddingBag)) and args:
                self.lookups[name] = args[0].numel() / m  # rows looked up per sample
        return elapsed, order

    def _explain(self, attr: ModuleAttribution, stage: str, exc: Exception) -> str:
        if stage == "backward":
            failure = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            return f"backward: {type(self.model).__name__} failed: {failure}"
        if attr.stack:
            name = attr.stack[-1][0]
            mod = self.by_name.get(name)
            msg = diagnose("" if name == ROOT else name, mod, attr.inputs.get(name), exc)
        else:
            msg = diagnose("", self.model, (), exc)
        if self.inferred:
            shape = [*self.input_spec["shape"]]
            msg += (
                f" (input inferred as {self.input_spec['dtype']} {shape}; pass sample_input=a batch "
                "the model accepts; in a magic: --sample-input VAR or --data VAR)"
            )
        else:
            declared, given = getattr(self.model, "input_spec", None), self.input_spec
            if isinstance(declared, dict) and isinstance(given, dict):
                expect = f"{declared.get('dtype')} {declared.get('shape')}"
                msg += (
                    f" ({type(self.model).__name__} takes per-sample {expect}; "
                    f"sample_input gives {given['dtype']} {given['shape']})"
                )
            else:
                msg += f" (sample_input per-sample spec {given}); pass a sample_input the model accepts"
        return msg

    def _timed_layers(self, m: int, count_flops: bool) -> LayerMeter:
        attr = self._attribution()
        meter = LayerMeter(attr, count_flops=count_flops, time_ops=True, cuda=self.cuda)
        handles = attr.attach()
        try:
            args = self.batch(m)
            with meter:
                self._step(args)
        except ProfileError:
            raise
        except Exception as exc:
            raise self._failed_at(m, exc) from None
        finally:
            for h in handles:
                h.remove()
        return meter

    def _fake_count(self) -> tuple[LayerMeter, dict[str, int]]:
        """FLOPs and activation bytes at the full batch, on fake tensors (no arithmetic)."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.func import functional_call

        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_params = {n: mode.from_tensor(p.detach()).requires_grad_(True) for n, p in self.params}
        others = [*self.model.named_parameters(), *self.model.named_buffers()]
        state = {n: mode.from_tensor(t.detach()) for n, t in others if n not in fake_params}
        args = tuple(mode.from_tensor(a) for a in self.batch(self.batch_size))
        attr = self._attribution(fake_params)
        meter = LayerMeter(attr, count_flops=True, time_ops=False)
        handles = attr.attach()
        try:
            with mode, meter:
                self._step(
                    args,
                    lambda a: functional_call(self.model, {**state, **fake_params}, a),
                    list(fake_params.values()),
                )
        finally:
            for h in handles:
                h.remove()
        return meter, dict(attr.outputs_bytes)

    # -- the whole thing ------------------------------------------------------------------------
    def run(self) -> ModelProfile:
        bs = self.batch_size
        # batch norm cannot train on one sample: no batch this profiler picks is below 2
        least = 2 if any(isinstance(x, nn.modules.batchnorm._BatchNorm) for _, x in self.modules) else 1
        second = max(least, bs // 2)
        if second >= bs:
            second = 2 * bs
        _, order = self._checked_step(bs)  # also the first warm-up pass
        for _ in range(self.warmup - 1):
            self._plain_step(bs)
        steps = self._time_steps(bs, STEP_SECONDS)
        step_time = statistics.median(steps)
        if self.warmup:
            self._plain_step(second)
        second_time = statistics.median(self._time_steps(second, FIT_SECONDS))
        fit = _fit_line(bs, step_time, second, second_time)
        threads = self._thread_scaling(bs, step_time)

        if self.micro_batch is not None:
            mb = max(min(least, bs), min(self.micro_batch, bs))
        elif step_time <= METER_STEP_SECONDS or fit["beta"] <= 0:
            mb = bs
        else:
            fits = int((METER_STEP_SECONDS - fit["alpha"]) / fit["beta"])
            mb = max(min(least, bs), min(bs, fits))
        # a dispatch mode's first use in a process sets up for ~1 s: not inside the metered passes' budget
        with LayerMeter(self._attribution(), count_flops=False, time_ops=False):
            torch.ones(1, device=self.device).add_(1)
        meters, started = [], time.perf_counter()
        for i in range(self.repeats):
            if i and time.perf_counter() - started > METER_SECONDS:
                break
            meters.append(self._timed_layers(mb, count_flops=(i == 0)))
        try:
            if mb == bs:  # the metered pass ran at the full batch: its count is the count (and fake
                # tensors would import torch._dynamo: seconds of a kernel's first profile)
                flops = {k: float(v) for k, v in meters[0].flops.items()}
                act_bytes = dict(meters[0].attr.outputs_bytes)
                flops_method = "counted at batch_size"
            else:
                fake, act_bytes = self._fake_count()
                flops = {k: float(v) for k, v in fake.flops.items()}
                flops_method = "fake tensors at batch_size"
        except Exception as exc:
            # an op fake tensors cannot run (data-dependent): scale the real count, exact for batch-linear ops
            scale = bs / mb
            flops = {k: v * scale for k, v in meters[0].flops.items()}
            act_bytes = {k: int(v * scale) for k, v in meters[0].attr.outputs_bytes.items()}
            flops_method = (
                f"counted at micro-batch {mb}, scaled to batch_size ({type(exc).__name__} on fake tensors)"
            )
        keys = {k for mt in meters for k in mt.seconds}
        seconds = {k: statistics.median(mt.seconds.get(k, 0.0) for mt in meters) for k in keys}
        prof = self._assemble(order, flops, seconds, act_bytes, step_time, flops_method)
        prof.meta.update(
            {
                "step_time_method": f"median of {len(steps)} plain steps at batch {bs}",
                "step_repeats": len(steps),
                "step_fit": fit,
                **threads,
                "meter_batch": mb,
                "meter_passes": len(meters),
            }
        )
        return prof

    def _thread_scaling(self, bs: int, step_time: float) -> dict[str, Any]:
        """The step at ``bs`` on one thread as well, when the process runs several: a rank gets
        fewer threads than the notebook when ranks share the cores, and how much a model gains
        from threads is its own (a GRU or an embedding model gains little, a wide MLP almost
        twice). ``thread_efficiency`` ``e`` fits ``seconds(t) = step_time (T / t) ** e``, so a rank
        of one thread is predicted from the one-thread step itself, which on a shared machine is
        the steadier of the two (a step on every core waits at each op for a thread the cluster's
        own processes delayed). A slow step (over ``METER_STEP_SECONDS``) is timed once, without
        a warm-up (the model is warm from the steps before): this pass costs a profile at most
        about one step on one thread."""
        big = torch.get_num_threads()
        if self.cuda or big < 2:
            return {}
        slow = step_time > METER_STEP_SECONDS
        torch.set_num_threads(1)
        try:
            if self.warmup and not slow:
                self._plain_step(bs)
            one = statistics.median(self._time_steps(bs, FIT_SECONDS, least=1 if slow else None))
        finally:
            torch.set_num_threads(big)
        e = math.log(max(one, 1e-12) / max(step_time, 1e-12)) / math.log(big)
        return {
            "thread_steps": {"threads": [big, 1], "seconds": [step_time, one]},
            "thread_efficiency": min(max(e, THREAD_EFFICIENCY_MIN), THREAD_EFFICIENCY_MAX),
        }

    def _time_steps(self, m: int, budget: float, least: int | None = None) -> list[float]:
        """Plain steps at batch ``m`` until their median is stable, ``budget`` seconds are spent or
        MAX_STEPS (at least ``least`` steps; ``max(MIN_STEPS, repeats)`` by default)."""
        least = max(MIN_STEPS, self.repeats) if least is None else least
        times: list[float] = []
        started = time.perf_counter()
        while len(times) < MAX_STEPS:
            times.append(self._plain_step(m))
            n = len(times)
            if n < least:
                continue
            spent = time.perf_counter() - started
            if n >= max(STABLE_STEPS, least) and spent >= SETTLE_SHARE * budget:
                medians = [statistics.median(times[:k]) for k in (n - 2, n - 1, n)]
                if max(medians) <= (1 + STABLE_WITHIN) * min(medians):
                    break
            if spent >= budget:
                break
        return times

    def _plain_step(self, m: int) -> float:
        """Seconds of one step at batch ``m`` (inputs built before the clock starts)."""
        args = self.batch(m)
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            self._step(args)
        except ProfileError:
            raise
        except Exception as exc:  # the first pass, at batch_size, ran: this batch is the cause
            raise self._failed_at(m, exc) from None
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _failed_at(self, m: int, exc: Exception) -> ProfileError:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return ProfileError(
            f"profile: a training step of {type(self.model).__name__} at batch {m} failed: "
            f"{type(exc).__name__}: {msg}"[:400]
        )

    def _assemble(self, order, flops, seconds, act_bytes, step_time, flops_method) -> ModelProfile:
        own_flops = defaultdict(float)
        for (name, _), v in flops.items():
            own_flops[name] += v
        owners = set(self.owner.values())
        ranked = {n: i for i, n in enumerate(dict.fromkeys(self.exec_order + [n for n, _ in self.modules]))}
        layer_names = [
            n
            for n, mod in self.modules
            if not any(True for _ in mod.children()) or n in owners or own_flops.get(n, 0.0) > 0
        ]
        layer_names.sort(key=lambda n: ranked[n])
        raw = sum(seconds.get((n, ph), 0.0) for n in layer_names for ph in ("fwd", "bwd"))
        tscale = step_time / raw if raw > 0 else 1.0
        params_of = defaultdict(int)
        for n, p in self.params:
            params_of[self.owner[n]] += p.numel()
        layers = tuple(
            LayerProfile(
                name=n,
                kind=type(self.by_name[n]).__name__,
                params=params_of[n],
                flops_fwd=flops.get((n, "fwd"), 0.0),
                flops_bwd=flops.get((n, "bwd"), 0.0),
                time_fwd=seconds.get((n, "fwd"), 0.0) * tscale,
                time_bwd=seconds.get((n, "bwd"), 0.0) * tscale,
                activation_bytes=int(act_bytes.get(n, 0)),
            )
            for n in layer_names
        )
        variables = tuple(self._variable(n, p) for n, p in self.params)
        names = [n for n, _ in self.params]
        ready = list(dict.fromkeys(order)) + [n for n in reversed(names) if n not in set(order)]
        cls = type(self.model).__name__
        meta = {
            "time_batch": self.batch_size,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "flops_method": flops_method,
            "layer_time_scale": tscale,
            "device": str(self.device),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "input_inferred": self.inferred,
            "model_class": cls,
            "touched_rows": "embedding lookups per step, capped at the table's rows (an upper bound)",
            "frozen_params": sum(p.numel() for p in self.model.parameters() if not p.requires_grad),
            # trainable variables the profiled step left without a gradient (torch's DDP reducer
            # fails on them: an own loop then uses distlab's buckets, own_route.py)
            "no_gradient": [n for n in names if n not in set(order)],
        }
        input_spec = self.input_spec if isinstance(self.input_spec, dict) else {"inputs": self.input_spec}
        target = getattr(self.model, "target_spec", None)
        return ModelProfile(
            variables=variables,
            layers=layers,
            batch_size=self.batch_size,
            grad_ready_order=tuple(ready),
            name=str(getattr(self.model, "zoo_name", None) or cls),
            input_spec=input_spec,
            target_spec=dict(target) if isinstance(target, dict) else None,
            step_time=step_time,
            meta=meta,
        )

    def _variable(self, name: str, p: torch.Tensor) -> VariableProfile:
        layer = self.owner[name]
        mod = self.by_name[layer]
        is_emb = isinstance(mod, (nn.Embedding, nn.EmbeddingBag))
        touched = None
        if is_emb and layer in self.lookups:  # at most one row per lookup of the step
            touched = min(int(p.shape[0]), int(round(self.lookups[layer] * self.batch_size)))
        return VariableProfile(
            name=name,
            shape=tuple(p.shape),
            dtype=dtype_name(p.dtype),
            nbytes=p.numel() * p.element_size(),
            sparse=bool(is_emb and getattr(mod, "sparse", False)),
            embedding=is_emb,
            layer=layer,
            touched_rows=touched,
        )


def _fit_line(b1: int, t1: float, b2: int, t2: float) -> dict[str, Any]:
    """``seconds = alpha + beta * batch`` through two measured steps, with ``alpha, beta >= 0``."""
    beta = (t1 - t2) / (b1 - b2)
    alpha = t1 - beta * b1
    if alpha < 0:
        alpha, beta = 0.0, t1 / b1
    elif beta < 0:
        alpha, beta = t1, 0.0
    return {"alpha": alpha, "beta": beta, "batches": [b1, b2], "seconds": [t1, t2]}
