"""Per-module FLOP counting and op timing for torch, attributing backward work to the module that made it.

``FlopCounterMode``'s own module tracker loses track in backward when a module's input needs no
gradient (embeddings, the first layer, parallel branches), so attribution here is exact instead:
each forward records which autograd nodes a module created (by sequence number), and in backward
``torch._C._current_autograd_node()`` names the node every op runs for. FLOP formulas are
``FlopCounterMode``'s registry (2 FLOPs per multiply-add), with CPU scaled-dot-product attention
mapped onto torch's own SDPA formulas: torch 2.13 counts it as 0 otherwise.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

ROOT = "(root)"  # layer name of the model itself (its qualified name is "")


def _as_4d(shape: Any) -> tuple[int, ...]:
    shape = tuple(shape)
    while len(shape) < 4:
        shape = (1, *shape)
    if len(shape) > 4:  # fold extra leading dims into the batch
        lead = 1
        for d in shape[:-3]:
            lead *= d
        shape = (lead, *shape[-3:])
    return shape


def _sdpa_fwd(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(_as_4d(query_shape), _as_4d(key_shape), _as_4d(value_shape))


def _sdpa_bwd(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_backward_flop_count(
        _as_4d(grad_out_shape), _as_4d(query_shape), _as_4d(key_shape), _as_4d(value_shape)
    )


def _cpu_sdpa_mapping() -> dict[Any, Callable[..., int]]:
    aten = torch.ops.aten
    pairs = {
        "_scaled_dot_product_flash_attention_for_cpu": _sdpa_fwd,
        "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_bwd,
        "_scaled_dot_product_fused_attention_overrideable": _sdpa_fwd,
        "_scaled_dot_product_fused_attention_overrideable_backward": _sdpa_bwd,
    }
    return {getattr(aten, name): fn for name, fn in pairs.items() if hasattr(aten, name)}


_REGISTRY: dict[Any, Callable[..., int]] | None = None


def flop_registry() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode's formulas plus the CPU SDPA ops (built once)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = FlopCounterMode(display=False, custom_mapping=_cpu_sdpa_mapping()).flop_registry
    return _REGISTRY


class ModuleAttribution:
    """Forward hooks that know the running module and which autograd nodes each module created.

    Install with :meth:`attach` (returns handles to remove). ``owner_of_param`` maps a
    parameter tensor's id to its layer, for the ``AccumulateGrad`` nodes of backward.
    """

    def __init__(self, modules: Iterable[tuple[str, nn.Module]], owner_of_param: dict[int, str]) -> None:
        self.modules = list(modules)
        self.owner_of_param = owner_of_param
        self.stack: list[tuple[str, int]] = []
        self.node_owner: dict[Any, str] = {}
        self.inputs: dict[str, Any] = {}  # modules in call order -> last input (kept for error messages)
        self.keep_inputs = False
        self.outputs_bytes: dict[str, int] = defaultdict(int)
        self.track_nodes = True

    def attach(self) -> list[Any]:
        handles = []
        for name, mod in self.modules:
            handles.append(mod.register_forward_pre_hook(self._pre(name)))
            handles.append(mod.register_forward_hook(self._post(name)))
        return handles

    def current(self) -> str:
        return self.stack[-1][0] if self.stack else ROOT

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any) -> None:
            self.stack.append((name, torch._C._autograd._get_sequence_nr()))
            self.inputs[name] = args if self.keep_inputs else None

        return hook

    def _post(self, name: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, output: Any) -> None:
            _, start = self.stack.pop()
            tensors = [t for t in flat_tensors(output)]
            self.outputs_bytes[name] += sum(t.numel() * t.element_size() for t in tensors)
            if self.track_nodes:
                self._claim([t.grad_fn for t in tensors if t.grad_fn is not None], name, start)

        return hook

    def _claim(self, roots: list[Any], name: str, start: int) -> None:
        # Nodes created since this module's forward began and not claimed by a child are its own.
        # Walk through children's nodes (without taking them) to reach ops made before a child ran.
        todo, seen = list(roots), set()
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if type(node).__name__ == "AccumulateGrad" or node._sequence_nr() < start:
                continue
            self.node_owner.setdefault(node, name)
            todo.extend(n for n, _ in node.next_functions)

    def owner(self, node: Any) -> str:
        """The layer whose backward is running ``node``."""
        got = self.node_owner.get(node)
        if got is not None:
            return got
        var = getattr(node, "variable", None)
        if var is not None:
            return self.owner_of_param.get(id(var), ROOT)
        return ROOT


def flat_tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in flat_tensors(item)]
    return []


class LayerMeter(TorchDispatchMode):
    """Counts FLOPs and/or times every aten op, per (layer, "fwd"|"bwd")."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in dynamo.disable, which imports torch._dynamo at
        # the first op (1-2.5 s of a kernel's first profile); nothing here runs under torch.compile
        return False

    def __init__(
        self, attribution: ModuleAttribution, *, count_flops: bool, time_ops: bool, cuda: bool = False
    ) -> None:
        super().__init__()
        self.attr = attribution
        self.count_flops = count_flops
        self.time_ops = time_ops
        self.cuda = cuda
        self.registry = flop_registry()
        self.flops: dict[tuple[str, str], float] = defaultdict(float)
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        node = torch._C._current_autograd_node()
        key = (self.attr.current(), "fwd") if node is None else (self.attr.owner(node), "bwd")
        if self.time_ops:
            if self.cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = func(*args, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()
            self.seconds[key] += time.perf_counter() - t0
        else:
            out = func(*args, **kwargs)
        if self.count_flops:
            formula = self.registry.get(func._overloadpacket)
            if formula is not None:
                self.flops[key] += formula(*args, **kwargs, out_val=out)
        return out
