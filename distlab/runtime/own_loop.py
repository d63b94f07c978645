"""A user's own training loop on one rank (``Lab.run(train)``): ``train(ctx)`` gets a ``TrainContext``
whose ``prepare`` puts the strategy under the user's model, optimizer and loader.

The loop stays the user's (AdaptDL's ``AdaptiveDataParallel`` and ``AdaptiveDataLoader``, Horovod's
``DistributedOptimizer``, accelerate's ``prepare``): the prepared optimizer's ``step()`` finishes the
strategy's gradient communication and steps the strategy's optimizers (built from the user's
optimizer class, kept in step with its ``param_groups``: a scheduler acts on every unit); the
prepared loader reads this rank's share of each global batch in the order ``lab.launch`` reads it.
A step boundary is the first fetch after an ``optimizer.step()``: there the step's record goes to
the driver, a checkpoint is taken when due and a stop (cancel, resize) is obeyed, so the loop
resumes at the exact step and sample after an elastic restart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from distlab.errors import LaunchError
from distlab.runtime.job import STEP_RECORD_KEYS, RankJob

# the columns distlab fills in each step's record; ``ctx.report`` may not name them
RESERVED = frozenset(STEP_RECORD_KEYS) | {"restart", "world", "trace"}


class StopTraining(BaseException):
    """(rank) The run was asked to stop (cancel, resize) and the loop fetched again: leave the
    user's function (a BaseException: a user's ``except Exception`` does not swallow it)."""


class TrainContext:
    """What ``train(ctx)`` gets on each rank of ``Lab.run``.

    Fields: ``rank`` and ``world`` (this rank, the run's ranks), ``device`` (where the model
    goes: ``"cpu"`` or ``"cuda:0"``), ``is_main`` (rank 0), ``step`` (optimizer steps done, a
    resumed run's included), ``epoch`` (the prepared loader's pass over the data), ``stopping``
    (a cancel or resize was agreed: the loader ends its epoch and ``epochs`` its loop).
    """

    def __init__(self, job: RankJob, session: Any) -> None:
        self.rank, self.world, self.device = job.rank, job.world, job.device
        self.is_main = job.rank == 0
        self._s = session

    @property
    def step(self) -> int:
        return self._s.step

    @property
    def epoch(self) -> int:
        return self._s.epoch

    @property
    def stopping(self) -> bool:
        return self._s.stopped

    def prepare(self, model: Any, optimizer: Any, loader: Any, scheduler: Any = None) -> tuple[Any, Any, Any]:
        """``(model, optimizer, loader)`` under the run's strategy: the model on ``device`` with
        rank 0's initial weights on every rank (and resumed from the run's checkpoint after a
        restart), the optimizer whose ``step()`` performs the strategy, the loader of this rank's
        share of each global batch (same sampler and order as ``lab.launch`` for the seed; the
        loader's ``collate_fn`` makes the batches). ``scheduler``: a learning-rate scheduler of
        ``optimizer``, checkpointed and restored with it. Call once, with the loader the run was
        planned on (its dataset, batch size, shuffle and collate function)."""
        return self._s.prepare(model, optimizer, loader, scheduler)

    @contextmanager
    def accumulate(self) -> Iterator[None]:
        """Micro-steps: each micro-step's forward and backward inside the block accumulate
        gradients locally, with no communication; the forward and backward after the block (the
        step's last) sync their sum. Divide each micro-step's loss by their number, as on one
        process. (As DDP's ``no_sync``: the forward decides whether its backward syncs.)"""
        self._s.require_prepared("ctx.accumulate()")
        self._s.sync.set_syncing(False)
        self._s.user_accumulating = True
        try:
            yield
        finally:
            self._s.sync.set_syncing(True)
            self._s.user_accumulating = False

    def epochs(self, n: int) -> Iterator[int]:
        """``range(n)`` from the epoch the run stands at (after a restart: the checkpoint's), ending
        early when the run is asked to stop."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise LaunchError(f"ctx.epochs: n={n!r}; pass the number of epochs, an int >= 1")
        e = self._s.epoch
        while e < n and not self._s.stopped:
            yield e
            e = max(e + 1, self._s.epoch)

    def state(self, name: str, obj: Any) -> Any:
        """Register ``obj`` (with ``state_dict``/``load_state_dict``) under ``name``: it is saved with
        every checkpoint and restored after a restart; returns ``obj``."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise LaunchError(
                f"ctx.state: {name!r} is a {type(obj).__name__} without state_dict/load_state_dict; "
                "register an object that has both (a module, an optimizer, a scheduler, your own class)"
            )
        self._s.register(str(name), obj)
        return obj

    def report(self, **scalars: Any) -> None:
        """Scalars for this step's record (``run.metrics`` columns and the live view's curves,
        ``loss`` first). Non-blocking: it only records them; any rank may report any number of times."""
        self._s.report(scalars)

    def barrier(self) -> None:
        """Every rank reaches this point (with the run's timeout)."""
        import torch.distributed as dist

        if self.world > 1:
            self._s.wait(dist.barrier(async_op=True))

    def all_reduce(self, t: torch.Tensor, op: str = "mean") -> torch.Tensor:
        """``t`` reduced over every rank in place (``"mean"``, ``"sum"``, ``"max"``, ``"min"``);
        returns it."""
        import torch.distributed as dist

        ops = {
            "mean": dist.ReduceOp.SUM,
            "sum": dist.ReduceOp.SUM,
            "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN,
        }
        if op not in ops:
            raise LaunchError(f"ctx.all_reduce: op={op!r}; one of {', '.join(ops)}")
        if not torch.is_tensor(t):
            raise LaunchError(f"ctx.all_reduce: a {type(t).__name__}; pass a tensor")
        if self.world > 1:
            self._s.wait(dist.all_reduce(t, op=ops[op], async_op=True))
        if op == "mean":
            t.div_(self.world) if t.is_floating_point() else t.floor_divide_(self.world)
        return t


class PreparedLoader:
    """This rank's batches of one epoch per iteration (``ctx.prepare``'s loader): positions in
    samples, as ``lab.launch`` reads them (runtime/data.py ``RankBatches``)."""

    def __init__(self, session: Any, loader: Any) -> None:
        self._s, self.dataset = session, loader.dataset
        self.collate_fn = getattr(loader, "collate_fn", None)

    @property
    def batch_size(self) -> int:
        """The per-replica batch (an adaptive run changes it at epoch boundaries)."""
        return self._s.batches.batch

    def __iter__(self) -> Iterator[Any]:
        s = self._s
        if s.stopped:
            raise StopTraining
        n = len(self.dataset)
        end = (s.pos // n + 1) * n
        while s.pos < end or s.micro:
            batch = s.next_batch()
            if batch is None:
                return
            yield batch

    def __len__(self) -> int:
        s, n = self._s, len(self.dataset)
        left = (s.pos // n + 1) * n - s.pos
        return math.ceil(left / (s.batches.batch * s.world))


class DistributedOptimizer(torch.optim.Optimizer):
    """The prepared optimizer: ``step()`` performs the strategy. Its ``param_groups`` are the user
    optimizer's (a scheduler built on either acts on every unit's optimizer); its state lives in the
    strategy's optimizers (``state_dict`` is theirs).

    ``synchronize()`` finishes the step's gradient communication first (Horovod's): after it, a
    parameter's ``grad`` is the average over ranks for all-reduce variables (AllReduce, Parallax's
    dense part; DDP averages during backward already), on its server for a PS variable, and the
    local gradient under gossip (which averages parameters, not gradients). ``clip_grad_norm_``
    clips by the norm of the averaged gradient under every strategy (a PS's served parts summed
    over servers).
    """

    def __init__(self, session: Any, user: torch.optim.Optimizer) -> None:  # noqa: D107 - no super(): a view
        self._s, self._user = session, user
        self.defaults = user.defaults
        self.param_groups = user.param_groups  # the same list: a scheduler's writes land here
        self._synced = False
        self._optimizer_step_pre_hooks: dict = {}
        self._optimizer_step_post_hooks: dict = {}
        self._optimizer_state_dict_pre_hooks: dict = {}
        self._optimizer_state_dict_post_hooks: dict = {}
        self._optimizer_load_state_dict_pre_hooks: dict = {}
        self._optimizer_load_state_dict_post_hooks: dict = {}

    @property
    def state(self) -> Any:  # type: ignore[override]
        opts = [o for o in (self._s.sync.local_opt, self._s.sync.server_opt) if o is not None]
        merged: dict = {}
        for o in opts:
            merged.update(o.state)
        return merged

    @state.setter
    def state(self, value: Any) -> None:  # torch's Optimizer may assign it; the strategy's hold it
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        s = self._s
        if s.batches.accum > 1 and s.hooks.backwards:
            # the strategy's micro-batches: a backward of this step ran, and its gradients add up
            # until the step (a loop calls zero_grad before each backward, or after each step())
            return
        s.sync.clear_grads()

    def synchronize(self) -> None:
        """Finish this step's gradient communication now (then clip, then ``step()``)."""
        s = self._s
        if self._synced or s.accumulating():
            return
        s.check_gradients()
        # AdaScale's gain from the noise measured up to the last step, as lab.launch takes it: this
        # step's sync updates the estimate
        s.gains = s.batches.gains()
        s.sync.sync_grads()  # the strategy's micro-batches: their mean (own_session.py ``_averaged``)
        self._synced = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the averaged gradient to ``max_norm`` (after ``synchronize``); returns its norm."""
        self.synchronize()
        return self._s.clip(float(max_norm), float(norm_type))

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise LaunchError(
                "optimizer.step(closure): closures (LBFGS) re-run forward and backward on one process; "
                "call step() without one under a distributed strategy"
            )
        s = self._s
        if s.accumulating():
            return  # the strategy's accumulation: only the step's last micro-batch steps
        self.synchronize()
        self._synced = False
        s.apply_step()
        self._user._opt_called = True  # type: ignore[attr-defined] - a scheduler of the user's optimizer checks it

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The strategy's optimizers' state (rank 0's replicated part; a server's own part)."""
        sync = self._s.sync
        out = {"replicated": sync.local_opt.state_dict() if sync.local_opt is not None else None}
        if sync.server_opt is not None:
            out["served"] = sync.server_opt.state_dict()
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        raise LaunchError(
            "optimizer.load_state_dict: a run restores its optimizer from its own checkpoints; "
            "register other state with ctx.state(name, obj)"
        )

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        raise LaunchError(
            "optimizer.add_param_group: the strategy's optimizers are built at ctx.prepare; add the "
            "group to your optimizer before preparing it"
        )

    def __repr__(self) -> str:
        return f"DistributedOptimizer({type(self._user).__name__}, {self._s.job.strategy.name})"


def make_optimizer_like(
    user: torch.optim.Optimizer, units: list, rank: int
) -> tuple[Callable[[list], Any], list]:
    """A factory of ``type(user)`` over a unit's targets, grouped as the user grouped their
    variables, and the ``(optimizer, group, user group)`` links the step keeps in step."""
    from distlab.runtime.stale_ps import stale_units

    group_of: dict[int, int] = {}
    for gi, g in enumerate(user.param_groups):
        for p in g["params"]:
            group_of[id(p)] = gi
    of_target = {id(u.target): group_of.get(id(u.param)) for u in units}
    of_target.update({id(u.param): group_of.get(id(u.param)) for u in units})
    # a stale or asynchronous PS server steps copies of its variables, made in its units' order
    # (runtime/stale_ps.py _Server): they are known by their place, checked by their shapes
    served = [u for u in stale_units(units) if u.sync.server == rank]
    cls: Any = type(user)  # the user's class, built as they built it: its groups, not keywords
    links: list[tuple[Any, int, int]] = []

    def make(targets: list) -> Any:
        known = dict(of_target)
        copies = len(targets) == len(served) and not any(id(t) in of_target for t in targets)
        if copies and all(t.shape == u.view(u.param).shape for t, u in zip(targets, served)):
            known.update({id(t): group_of.get(id(u.param)) for t, u in zip(targets, served)})
        groups: dict[int, list] = {}
        for t in targets:
            gi = known.get(id(t))
            if gi is not None:  # a variable the user's optimizer does not step stays as it is
                groups.setdefault(gi, []).append(t)
        if not groups:  # nothing of this rank's to step here: an optimizer over no variable
            # its settings as a group, not keywords: a group holds keys its class's __init__ does
            # not take (AdamW's decoupled_weight_decay)
            empty = {"params": [torch.zeros(0, requires_grad=True)], **hyperparameters(user.param_groups[0])}
            return cls([empty])
        order = sorted(groups)
        opt = cls([{"params": groups[gi], **hyperparameters(user.param_groups[gi])} for gi in order])
        links.extend((opt, i, gi) for i, gi in enumerate(order))
        return opt

    return make, links


def hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    """An optimizer group's settings (lr, momentum, ...): everything but its parameters."""
    return {k: v for k, v in group.items() if k != "params"}


def check_report(scalars: dict[str, Any]) -> dict[str, float]:
    """``ctx.report``'s values as floats, or one error naming the bad one."""
    out: dict[str, float] = {}
    for k, v in scalars.items():
        if k in RESERVED and k != "loss":
            raise LaunchError(f"ctx.report: {k!r} is a column distlab fills in; report it under another name")
        if torch.is_tensor(v):
            if v.numel() != 1:
                raise LaunchError(
                    f"ctx.report: {k}= is a tensor of shape {tuple(v.shape)}; report a scalar ({k}=t.item() "
                    "of a one-element tensor, or a mean)"
                )
            v = v.detach().item()
        if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
            raise LaunchError(f"ctx.report: {k}={v!r} is not a number; report ints and floats")
        f = float(v)
        if not math.isfinite(f):
            raise LaunchError(
                f"ctx.report: {k}={f} is not finite; the loss diverged or a metric divided by zero "
                "(lower the learning rate, or clip the gradient)"
            )
        out[k] = f
    return out
