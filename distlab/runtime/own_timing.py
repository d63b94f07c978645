"""A user's own loop, timed as distlab's loop times its own: each forward and backward found through
hooks on the prepared model, a straggler's or jitter's wait put before each backward, their trace
spans, the step's exposed communication and its metrics (``Lab.run``; runtime/own_session.py).

distlab's loop calls forward, the loss and backward itself and times them between the calls
(runtime/trainer.py). A user's loop calls them, so here a forward begins at the model's forward
pre-hook, and ends (its loss included, as distlab's loop counts it) where backward begins: the
gradient hook of the model's output, the first thing backward runs. Backward ends after the
engine's end-of-backward callbacks, DDP's wait for its buckets included, as ``loss.backward()``
returns after them in distlab's loop.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from distlab.errors import LaunchError
from distlab.runtime.straggler import Straggler


def _engine() -> Any:
    """Autograd's engine (``queue_callback``: run a function when the current backward ends, as
    DDP's reducer and FSDP do)."""
    return torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]


def output_tensor(out: Any) -> torch.Tensor | None:
    """The model output's tensor that a metric reads: the output, its ``logits`` (a model library's
    output object), or the first tensor of a tuple."""
    if torch.is_tensor(out):
        return out
    value = getattr(out, "logits", None)
    if value is None and isinstance(out, dict):
        value = out.get("logits")
    if torch.is_tensor(value):
        return value
    if isinstance(out, (tuple, list)) and out and torch.is_tensor(out[0]):
        return out[0]
    return None


def batch_target(batch: Any) -> Any:
    """A batch's target, as distlab's loop reads it: the second of an ``(input, target)`` pair, a
    dict's ``labels``; None when it has none."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[1]
    get = getattr(batch, "get", None)
    return get("labels") if hasattr(batch, "keys") and callable(get) else None


def _grad_tensors(out: Any) -> list[torch.Tensor]:
    """Tensors of a model's output that a backward can pass through."""
    if torch.is_tensor(out):
        return [out] if out.requires_grad else []
    if isinstance(out, dict) or hasattr(out, "values"):
        values = list(out.values())
    elif isinstance(out, (tuple, list)):
        values = list(out)
    else:
        return []
    return [t for v in values for t in _grad_tensors(v)]


class ComputeHooks:
    """One rank's forward and backward in a user's loop, timed and slowed as distlab's loop's
    (module docstring); ``record()`` is a step's share of its record."""

    def __init__(self, job: Any, model: torch.nn.Module, sync: Any, tracer: Any) -> None:
        self.slow = Straggler.for_job(job)
        self.metrics = job.options.metrics
        self.sync, self.tracer = sync, tracer
        self.target: Any = None  # the target of the batch the loop fetched last (metrics read it)
        self.backward_end = 0.0  # when the step's last backward ended (its exposed communication's end)
        self._t_fwd: float | None = None  # when the forward being timed began
        self._t_bwd = 0.0
        self.backwards = 0  # backwards ended in this step (the strategy's micro-batches count each)
        self._values = dict.fromkeys((m.name for m in self.metrics), 0.0)
        self._counted = 0
        self._handles = [
            model.register_forward_pre_hook(self._forward_begins),
            model.register_forward_hook(self._forward_ends),
        ]

    def _forward_begins(self, module: Any, args: Any) -> None:
        if torch.is_grad_enabled() and self._t_fwd is None:
            self._t_fwd = time.perf_counter()

    def _forward_ends(self, module: Any, args: Any, out: Any) -> None:
        if not torch.is_grad_enabled() or self._t_fwd is None:
            return
        tensors = _grad_tensors(out)
        if not tensors:
            return
        fired = [False]

        def backward_begins(*grads: Any) -> None:
            if not fired[0]:  # an output of several tensors: the first reached begins backward
                fired[0] = True
                self._backward_begins()

        for t in tensors:
            # the node that made the tensor, before it runs (cheaper than a tensor's own hook)
            if t.grad_fn is not None:
                t.grad_fn.register_prehook(backward_begins)
            else:
                t.register_hook(backward_begins)
        if self.metrics:
            self._measure(out)

    def _measure(self, out: Any) -> None:
        """The metrics on this forward's output and the fetched batch's target, before the update
        (``RunOptions.metrics``), as distlab's loop measures each micro-batch."""
        y, o = self.target, output_tensor(out)
        if y is None or o is None or not torch.is_tensor(y):
            names = ", ".join(m.name for m in self.metrics)
            raise LaunchError(
                f"metrics: {names} need the model's output tensor (or its logits) and the batch's target "
                "(an (input, target) pair, or a dict batch's 'labels'); this loop's batch or output has "
                "none: leave metrics= out and ctx.report(name=value) your own"
            )
        for m in self.metrics:
            self._values[m.name] += m(o, y)
        self._counted += 1

    def _backward_begins(self) -> None:
        now = time.perf_counter()
        t0 = self._t_fwd if self._t_fwd is not None else now
        self.tracer.add("forward", "forward", t0, now, micro=self.backwards)
        self.slow.wait(now - t0, self.tracer)
        self._t_bwd = time.perf_counter()
        # queued again from the first callback, so it runs after the callbacks queued during
        # backward: DDP's reducer queues its wait for the last buckets there
        _engine().queue_callback(lambda: _engine().queue_callback(self._backward_ends))

    def _backward_ends(self) -> None:
        now = time.perf_counter()
        self.slow.backward_took(now - self._t_bwd)
        self.tracer.add("backward", "backward", self._t_bwd, now, micro=self.backwards)
        self.backward_end = now
        self._t_fwd = None
        self.backwards += 1

    def record(self) -> dict[str, float]:
        """The step's ``compute`` and ``delay`` (runtime/straggler.py), its exposed communication
        (``exposed``: from the last gradient ready to the end of backward) and its metrics' means."""
        last = self.sync.last_ready
        exposed = max(0.0, self.backward_end - last) if last and self.backward_end else 0.0
        out = {"exposed": exposed, **self.slow.record()}
        if self.metrics:
            n = self._counted or 1
            out.update({k: v / n for k, v in self._values.items()})
            self._values = dict.fromkeys(self._values, 0.0)
            self._counted = 0
        self.backwards, self.backward_end = 0, 0.0
        return out

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
