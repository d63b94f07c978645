"""``dl.profile``: measure a torch model (variables, per-layer FLOPs and times, gradient-ready order) into a ModelProfile."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from distlab.errors import ProfileError
from distlab.profile.model_profile import LayerProfile, ModelProfile, VariableProfile
from distlab.profile.torch_inputs import Batch, diagnose, dtype_name, make_batcher
from distlab.profile.torch_meter import ROOT, LayerMeter, ModuleAttribution, _flat_tensors

TARGET_STEP_SECONDS = 0.25  # timed passes run at the largest micro-batch that keeps one step near this
COLD_PASS_MAX = 10.0  # a first pass slower than this is not repeated to size the micro-batch
CLEAN_STEP_BELOW = 0.2  # steps shorter than this are also timed without the per-op meter
CLEAN_PASSES_MAX, CLEAN_PASSES_SECONDS = 15, 0.6  # more clean passes when they fit in this time


def profile(
    model: Any,
    sample_input: Any = None,
    batch_size: int = 32,
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

    FLOPs and activation bytes are exact at ``batch_size``: they are counted on fake tensors
    (shapes only, no arithmetic). Times are measured on real tensors at a micro-batch (the
    largest that keeps a step near 0.25 s, or ``micro_batch``) and scaled linearly to
    ``batch_size``; ``meta["time_batch"]`` says which. Each time is the median of
    ``repeats`` passes after ``warmup`` passes. Backward is driven by a gradient of ones on
    every output, so the loss itself is not part of the profile. ``step_time`` is the median
    of plain passes or, for steps over 0.2 s, of the per-op timed passes themselves
    (``meta["step_time_method"]``); per-layer times are scaled so that they add up to it
    (``meta["layer_time_scale"]``).

    The model's training mode, gradients, buffers and the global RNG state are restored.
    """
    if _is_keras(model):
        from distlab.profile.keras_profiler import profile_keras

        return profile_keras(model, sample_input, batch_size, repeats=repeats, warmup=warmup)
    if not isinstance(model, nn.Module):
        raise ProfileError(f"profile: expected a torch nn.Module or keras.Model, got {type(model).__name__}")
    for label, value, low in (("batch_size", batch_size, 1), ("repeats", repeats, 1), ("warmup", warmup, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ProfileError(f"profile: {label} must be an integer >= {low}, got {value!r}")
    if micro_batch is not None and (not isinstance(micro_batch, int) or micro_batch < 1):
        raise ProfileError(f"profile: micro_batch must be an integer >= 1, got {micro_batch!r}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ProfileError(
            f"profile: {type(model).__name__} has no trainable parameters, so there is nothing to distribute; "
            "pass a model with parameters (requires_grad=True)"
        )
    started = time.perf_counter()
    with _preserved(model):
        prof = _TorchProfiler(model, sample_input, batch_size, repeats, warmup, micro_batch, seed).run()
    prof.meta["profile_seconds"] = time.perf_counter() - started
    return prof


def _is_keras(model: Any) -> bool:
    roots = {c.__module__.split(".")[0] for c in type(model).__mro__}
    if not roots & {"keras", "tensorflow", "tf_keras"}:
        return False
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        raise ProfileError(
            f"profile: {type(model).__name__} is a Keras model but TensorFlow is not installed; pip install distlab[tf]"
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
        """Backward from every trainable floating-point output (a ones gradient each)."""
        outs = [t for t in _flat_tensors(out) if t.requires_grad and t.is_floating_point()]
        if not outs:
            raise ProfileError(
                f"forward: the output of {type(self.model).__name__} does not depend on its trainable parameters; "
                "profile the module whose output is trained"
            )
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
            return f"backward: {type(self.model).__name__} failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
        if attr.stack:
            name = attr.stack[-1][0]
            mod = self.by_name.get(name)
            msg = diagnose("" if name == ROOT else name, mod, attr.inputs.get(name), exc)
        else:
            msg = diagnose("", self.model, (), exc)
        if self.inferred:
            shape = [*self.input_spec["shape"]]
            msg += f" (input inferred as {self.input_spec['dtype']} {shape}; pass sample_input=a batch the model accepts)"
        else:
            declared, given = getattr(self.model, "input_spec", None), self.input_spec
            if isinstance(declared, dict) and isinstance(given, dict):
                expect = f"{declared.get('dtype')} {declared.get('shape')}"
                msg += f" ({type(self.model).__name__} takes per-sample {expect}; sample_input gives {given['dtype']} {given['shape']})"
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
        # batch norm cannot train on one sample
        least = min(
            bs, 2 if any(isinstance(x, nn.modules.batchnorm._BatchNorm) for _, x in self.modules) else 1
        )
        m = first_m = max(least, min(self.micro_batch or 1, bs))
        cold, order = self._checked_step(m)  # also the first warm-up pass
        warmed = 1
        # a cold pass may be slow from first-use setup (seconds, for a model of milliseconds): size
        # the micro-batch on a warm one, else a step's fixed cost is scaled up with the batch
        if self.micro_batch is None and m < bs and cold < COLD_PASS_MAX:
            warm = self._timed_step(m)
            warmed += 1
            m = max(least, min(bs, int(TARGET_STEP_SECONDS * m / max(warm, 1e-6))))
            warmed = warmed if m == first_m else 0
        for _ in range(max(self.warmup - warmed, 0)):
            self._step(self.batch(m))
        meters, walls = [], []
        for i in range(self.repeats):
            t0 = time.perf_counter()
            meters.append(self._timed_layers(m, count_flops=(i == 0)))
            walls.append(time.perf_counter() - t0)
        if statistics.median(walls) < CLEAN_STEP_BELOW:
            # clean passes are cheap: take enough for a steady median (a shared machine is noisy)
            n = max(
                self.repeats,
                min(CLEAN_PASSES_MAX, int(CLEAN_PASSES_SECONDS / max(statistics.median(walls), 1e-6))),
            )
            steps, step_method = [self._timed_step(m) for _ in range(n)], f"median of {n} clean passes"
        else:  # per-op timing overhead is negligible against a step this long: reuse the timed passes
            steps, step_method = walls, "timed passes"
        scale = bs / m
        try:
            fake, act_bytes = self._fake_count()
            flops = {k: float(v) for k, v in fake.flops.items()}
            flops_method = "fake tensors at batch_size"
        except Exception as exc:
            # an op fake tensors cannot run (data-dependent): scale the real count, exact for batch-linear ops
            flops = {k: v * scale for k, v in meters[0].flops.items()}
            act_bytes = {k: int(v * scale) for k, v in meters[0].attr.outputs_bytes.items()}
            flops_method = (
                f"counted at micro-batch {m}, scaled to batch_size ({type(exc).__name__} on fake tensors)"
            )
        keys = {k for mt in meters for k in mt.seconds}
        seconds = {k: statistics.median(mt.seconds.get(k, 0.0) for mt in meters) * scale for k in keys}
        step_time = statistics.median(steps) * scale
        prof = self._assemble(order, flops, seconds, act_bytes, step_time, m, flops_method)
        prof.meta["step_time_method"] = step_method
        return prof

    def _timed_step(self, m: int) -> float:
        args = self.batch(m)
        if self.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self._step(args)
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _assemble(self, order, flops, seconds, act_bytes, step_time, m, flops_method) -> ModelProfile:
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
            "time_batch": m,
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
