"""One rank's run of a training function, ``train(ctx)``: a user's own loop (``Lab.run``) or distlab's
(``lab.launch``, runtime/builtin_loop.py). The strategy's synchroniser (runtime/trainer.py
``make_sync``), batches, checkpoints, stop and records, driven by the loop's calls through
``TrainContext`` (runtime/own_loop.py).

Long because the session is one state machine over a step (fetch, forward, backward, the
optimizer's step, the boundary) that every call of the context moves on.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from distlab.errors import DistlabError, LaunchError
from distlab.runtime import own_loop
from distlab.runtime.builtin_loop import BuiltinLoop, default_optimizer
from distlab.runtime.data import to_device
from distlab.runtime.job import STEP_RECORD_KEYS, RankJob
from distlab.runtime.own_checks import check_loader, check_optimizer
from distlab.runtime.own_timing import ComputeHooks, batch_target


def run_own(
    job: RankJob, store: Any, emit: Any, should_stop: Any, progress: dict[str, int], wait: Callable
) -> dict[str, Any]:
    """(rank) ``job.train_fn(ctx)`` to its end; the result ``run_rank`` returns, with ``result``:
    rank 0's return value."""
    session = OwnSession(job, store, emit, should_stop, progress, wait)
    ctx = own_loop.TrainContext(job, session)
    result = None
    try:
        try:
            result = job.train_fn(ctx)  # type: ignore[misc]
        except own_loop.StopTraining:
            pass
        if session.sync is None:
            raise LaunchError(
                "lab.run: train(ctx) returned without calling ctx.prepare(model, optimizer, loader) on "
                f"rank {job.rank}; every rank prepares once"
            )
        out = session.finish()
    finally:
        session.close()
    out["result"] = result if job.rank == 0 else None
    return out


class OwnSession:
    """One rank's run of a user's loop (module docstring); ``TrainContext`` is its face."""

    def __init__(
        self, job: RankJob, store: Any, emit: Any, should_stop: Any, progress: dict[str, int], wait: Callable
    ) -> None:
        from distlab.runtime.trace import OFF, Tracer, align

        self.job, self.store, self.emit, self.should_stop = job, store, emit, should_stop
        self.progress, self.wait = progress, wait
        self.world = job.world
        self.tracer: Any = OFF
        if job.options.trace:
            self.tracer = Tracer()
            align(self.tracer, job.rank, job.world, job.device)
        self.sync: Any = None
        self.hooks: Any = None  # the forward and backward's timing (runtime/own_timing.py), at prepare
        self.ckpts: Any = None
        self.stop: Any = None  # the agreed stop (process_group.StopSignal), at prepare
        self.batches: Any = None
        self.model: Any = None
        self.units: list = []
        self.step, self.pos, self.micro = job.start_step, job.sample_offset, 0
        self.stopped = False
        self.records: list[dict[str, Any]] = []
        self._registered: dict[str, Any] = {}
        self._restored: dict[str, Any] = {}
        self._scheduler: Any = None
        self.user_accumulating = False  # inside ctx.accumulate()
        self._sent: set[int] = set()  # variables whose gradient this step's backward sent to be averaged
        self._forward_syncs = False  # the last forward (with grad) ran outside ctx.accumulate()
        self._grad_hooks: list[Any] = []
        self.gains: Any = 1.0  # the learning-rate gain of the step being taken (runtime/adaptive.py)
        self._links: list = []
        self._values: dict[str, float] = {}
        self._pending: dict[str, Any] | None = None
        self._stepped = self._started = False
        self._step_pos = self.pos
        self._t0 = time.perf_counter()
        self._n = 0

    # -- prepare -------------------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.pos // self._n if self._n else 0

    def require_prepared(self, what: str) -> None:
        if self.sync is None:
            raise LaunchError(f"{what}: before ctx.prepare(model, optimizer, loader); prepare them first")

    def prepare(self, model: Any, optimizer: Any, loader: Any, scheduler: Any) -> tuple[Any, Any, Any]:
        # Long because prepare is one ordered set-up: the checks a user's objects get, the weights
        # made equal, then the strategy's runtime built as the built-in loop builds it
        from distlab.runtime.adaptive import BatchState
        from distlab.runtime.cut import EndRendezvous
        from distlab.runtime.plan import build_units
        from distlab.runtime.process_group import StopSignal, failure_of_other
        from distlab.runtime.resume import Checkpoints, resume
        from distlab.runtime.trainer import (
            consistency_record,
            goodput_controller,
            is_asynchronous,
            make_sync,
            stop_margin,
        )

        if self.sync is not None:
            raise LaunchError(
                "ctx.prepare: called twice; prepare the model, optimizer and loader once, in one call"
            )
        if not isinstance(model, torch.nn.Module):
            raise LaunchError(f"ctx.prepare: model is a {type(model).__name__}; pass your torch.nn.Module")
        if not isinstance(optimizer, torch.optim.Optimizer) or isinstance(
            optimizer, own_loop.DistributedOptimizer
        ):
            raise LaunchError(
                f"ctx.prepare: optimizer is a {type(optimizer).__name__}; pass the torch.optim.Optimizer "
                "you built on model.parameters() (prepared once)"
            )
        shuffle, collate = check_loader(loader)
        job = self.job
        model = model.to(job.device)
        check_optimizer(model, optimizer)
        builtin = isinstance(self.job.train_fn, BuiltinLoop)
        # every rank of a user's loop starts from rank 0's weights, as lab.launch's pickled model
        # does; distlab's loop trains each rank's own model as given (a test's may differ)
        if self.world > 1 and not builtin:
            import torch.distributed as dist

            for t in model.state_dict().values():
                self.wait(dist.broadcast(t, src=0, async_op=True))
        try:
            units = build_units(model, job.strategy, job.world)
        except DistlabError as exc:
            raise LaunchError(
                f"ctx.prepare: this model is not the one lab.run planned its strategy for ({exc}); "
                "build the same model on every rank"
            ) from None
        self._n = len(loader.dataset)
        job = self.job = dataclasses.replace(
            job, data=loader.dataset, batch_size=int(loader.batch_size), shuffle=shuffle
        )
        if builtin:  # lab.launch's optimizer factory makes them
            make_opt, self._links = job.optimizer or default_optimizer, []
        else:  # made like the user's optimizer, kept in step with its groups
            make_opt, self._links = own_loop.make_optimizer_like(optimizer, units, job.rank)
        if job.strategy.batch.accumulation > 1 or job.options.adaptive is not None:
            # the strategy's micro-batches: each one's gradient divided by their number as it
            # arrives, as dividing the loss would (a loss term on the variables outside the model's
            # output with it). Registered before the strategy's own hooks, which run after it: the
            # sync, the noise measure and a compressor see what they saw in distlab's loop
            self._grad_hooks += [
                p.register_hook(self._averaged) for p in model.parameters() if p.requires_grad
            ]
        sync = make_sync(job, model, units, make_opt, self.wait, self.tracer)
        noise = getattr(sync, "noise", None)
        opts = [sync.local_opt, sync.server_opt]
        self.batches = BatchState(job, noise, opts, self.wait, goodput_controller(job), collate)
        self.model, self.units, self.sync, self._scheduler = model, units, sync, scheduler
        if job.resume_from:
            self._restored = resume(job, model, sync, units, self.batches).get("user") or {}
            # a scheduler's state_dict holds its counters, not the learning rate it set: that lives
            # in the optimizer's groups, which each step copies onto the strategy's optimizers
            for group, saved in zip(optimizer.param_groups, self._restored.get("groups") or []):
                group.update(saved)
            if scheduler is not None and self._restored.get("scheduler") is not None:
                scheduler.load_state_dict(self._restored["scheduler"])
            for name, obj in self._registered.items():
                self._restore(name, obj)
        self.asynchronous = is_asynchronous(sync)
        margin = stop_margin(sync, job.world)
        self.stop = StopSignal(self.store, self.should_stop, margin=margin, at_once=self.asynchronous)
        self.ckpts = Checkpoints(
            job, model, sync, units, self.batches, self.store, self.asynchronous, self._extra
        )
        rank = job.rank
        self.end = EndRendezvous(
            self.store, rank, job.world, job.timeout, lambda: failure_of_other(self.store, rank, wait=0.0)
        )
        # a user's mistakes refused as they happen (distlab's loop makes none of them); gossip
        # averages parameters, not gradients, and a second backward sends nothing
        if not builtin and any(u.sync.kind != "gossip" for u in units):
            self._grad_hooks += [
                p.register_post_accumulate_grad_hook(self._on_grad)
                for p in model.parameters()
                if p.requires_grad
            ]
            self._grad_hooks.append(model.register_forward_pre_hook(self._on_forward))
        self.hooks = ComputeHooks(job, model, sync, self.tracer)
        self._consistency = consistency_record
        model.train()
        self.optimizer = own_loop.DistributedOptimizer(self, optimizer)
        return getattr(sync, "wrapped", model), self.optimizer, own_loop.PreparedLoader(self, loader)

    def _averaged(self, grad: torch.Tensor) -> torch.Tensor | None:
        k = self.batches.accum
        return grad / k if k > 1 else None

    def register(self, name: str, obj: Any) -> None:
        self._registered[name] = obj
        if self._restored:
            self._restore(name, obj)

    def _restore(self, name: str, obj: Any) -> None:
        saved = (self._restored.get("states") or {}).get(name)
        if saved is not None:
            obj.load_state_dict(saved)

    def _extra(self) -> dict[str, Any]:
        """What a checkpoint keeps of the user's loop (runtime/resume.py ``Checkpoints.extra``)."""
        return {
            "groups": [own_loop.hyperparameters(g) for g in self.optimizer.param_groups],
            "scheduler": self._scheduler.state_dict() if self._scheduler is not None else None,
            "states": {name: obj.state_dict() for name, obj in self._registered.items()},
        }

    # -- the loop ------------------------------------------------------------------------------------
    def accumulating(self) -> bool:
        """Between the micro-batches of one step of the strategy's accumulation."""
        return self.batches is not None and self.batches.accum > 1 and self.micro != 0

    def next_batch(self) -> Any:
        """This rank's next batch, or None once the run was asked to stop (a step boundary first)."""
        if self._stepped:
            self._boundary()
        elif not self._started:
            self._started = True
            if self.stop.stop_before(self.step):
                self.stopped = True
                self.ckpts.at_stop(self.step, self.pos)
            self._new_step()
        if self.stopped:
            return None
        b = self.batches
        if self.micro == 0:
            self._step_pos = self.pos
        batch = b.data.get(self._step_pos, self.micro)
        if b.accum > 1:
            self.sync.set_syncing(self.micro == b.accum - 1)
        self.micro = (self.micro + 1) % b.accum
        if self.micro == 0:  # the step's last micro-batch fetched: the position is past the step
            self.pos = self._step_pos + b.global_batch
        batch = to_device(batch, self.job.device)
        self.hooks.target = batch_target(batch)
        return batch

    def _on_forward(self, module: Any, args: Any) -> None:
        """Whether the backward of this forward syncs (``_on_grad``); an evaluation's does not count."""
        if torch.is_grad_enabled():
            self._forward_syncs = not (self.user_accumulating or self.accumulating())

    def _on_grad(self, p: torch.Tensor) -> None:
        """A second backward in one step would come after the strategy sent the first one's
        gradients (its hooks launch the all-reduce, the PS push): its own would be averaged late,
        or not at all. Refused, as Horovod refuses more backward passes than it was told of. So is
        a ``ctx.accumulate()`` backward of a forward run outside the block: DDP decides at the
        forward whether its backward syncs (its ``no_sync`` contract), so it would have synced."""
        if self.user_accumulating:
            if self._forward_syncs:
                raise LaunchError(
                    f"ctx.accumulate(): in step {self.step} a backward inside the block followed a forward "
                    "outside it; put each micro-step's forward and backward inside the block"
                )
            return
        if self.accumulating():
            return
        if id(p) in self._sent:
            raise LaunchError(
                f"loss.backward() ran twice in step {self.step} before optimizer.step() (the first pass's "
                "gradients were already sent); add the losses and call backward once, or accumulate "
                "with ctx.accumulate()"
            )
        self._sent.add(id(p))

    def check_gradients(self) -> None:
        if not self.hooks.backwards and not any(p.grad is not None for p in self.model.parameters()):
            raise LaunchError(
                f"optimizer.step() at step {self.step}: no variable has a gradient; call loss.backward() "
                "before optimizer.step()"
            )

    def clip(self, max_norm: float, norm_type: float) -> torch.Tensor:
        """Clip the synchronised gradient by its global norm: replicated variables' gradients are
        equal on every rank; a PS variable's is on its server only (summed over the servers)."""
        import torch.distributed as dist

        ps = [u for u in self.units if u.sync.kind == "ps"]
        ps_params = {id(u.param) for u in ps}
        grads = [p.grad for p in self.model.parameters() if p.grad is not None and id(p) not in ps_params]
        served = [u.target.grad for u in ps if u.sync.server == self.job.rank and u.target.grad is not None]
        part = lambda gs: sum(float((_dense(g).abs() ** norm_type).sum()) for g in gs)  # noqa: E731
        total = torch.tensor([part(grads), part(served)], dtype=torch.float64)
        if ps and self.world > 1:
            shared = total[1:].clone()
            self.wait(dist.all_reduce(shared, async_op=True))
            total[1] = shared[0]
        norm = float(total.sum()) ** (1.0 / norm_type)
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for g in grads + served:
                g.mul_(coef)
        return torch.tensor(norm)

    def apply_step(self) -> None:
        b, sync = self.batches, self.sync
        gains = self.gains  # taken before the gradients' sync (DistributedOptimizer.synchronize)
        for opt, i, gi in self._links:  # the user's (and their scheduler's) hyperparameters
            for k, v in self.optimizer.param_groups[gi].items():
                if k != "params":
                    opt.param_groups[i][k] = v
        with b.scaled(gains):
            sync.apply(self.step)
        self._sent.clear()
        t1 = time.perf_counter()
        seconds = t1 - self._t0
        job = self.job
        timed = self.hooks.record()
        comm = timed.pop("exposed") + sync.comm_time  # as distlab's loop counts it
        values = (job.run_id, self.step, job.rank, math.nan, self.pos, seconds, comm)
        rec: dict[str, Any] = dict(zip(STEP_RECORD_KEYS, (*values, time.time())))
        rec.update(b.after_step(self._step_pos, self.pos, seconds, gains), **timed)
        rec.update(self._consistency(sync))
        if self.tracer.enabled:
            rec["trace"] = self.tracer.take()
        self._pending = rec
        self.step += 1
        self.progress["step"] = self.step
        self._stepped = True

    def report(self, scalars: dict[str, Any]) -> None:
        self._values.update(own_loop.check_report(scalars))

    def _flush(self) -> None:
        rec, self._pending = self._pending, None
        if rec is None:
            return
        rec.update(self._values)
        self._values = {}
        self.records.append(rec)
        if self.emit is not None:
            self.emit(rec)

    def _boundary(self) -> None:
        """Between two steps: the record out, a checkpoint when due, a stop when agreed."""
        self._flush()
        self._stepped = False
        self.ckpts.after_step(self.step, self.pos)
        if self.asynchronous:
            self.end.progress(self.step)
        if self.stop.stop_before(self.step):
            self.stopped = True
            self.ckpts.at_stop(self.step, self.pos)
        self._new_step()

    def _new_step(self) -> None:
        """A step begins (as distlab's loop begins one): gradient tasks reset, and an AWC gossip's
        parameters sent now, to be hidden behind forward and backward."""
        self._t0 = time.perf_counter()
        self.sync.new_step()
        if not self.stopped:
            self.sync.begin(self.step)

    def finish(self) -> dict[str, Any]:
        """After ``train`` returned: the last record, the checkpoints joined, the run's end."""
        self._flush()
        if self._stepped:  # the last step's boundary, as every other step's: a checkpoint when due
            self._stepped = False
            self.ckpts.after_step(self.step, self.pos)
            if self.asynchronous:
                self.end.progress(self.step)
        if not self.stopped:
            self.ckpts.at_end(self.pos, self.step)
        if self.asynchronous:
            self.sync.finish(self.end.wait)
        else:
            self.sync.finish()
        distance = self.sync.gossip.consensus_distance() if self.sync.gossip is not None else None
        last = self.ckpts.wait()
        job = self.job
        return {
            "rank": job.rank,
            "steps": len(self.records),
            "records": self.records,
            "state_dict": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
            if job.rank == 0
            else None,
            "checkpoint": last,
            "consensus_distance": distance,
            "stopped": self.stopped,
        }

    def close(self) -> None:
        if self.stop is not None:
            self.stop.close()
        for h in self._grad_hooks:
            h.remove()
        if self.hooks is not None:
            self.hooks.close()
        if self.ckpts is not None:
            self.ckpts.close()
        if self.sync is not None:
            self.sync.close()


def _dense(g: torch.Tensor) -> torch.Tensor:
    return g.coalesce().values() if g.is_sparse else g
