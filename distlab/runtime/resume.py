"""A rank's checkpoints: when they are taken (runtime/cut.py), the consistent cut's payload written
off the training thread, and a checkpoint loaded back into the model, optimizers and batch state."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from distlab.errors import LaunchError
from distlab.runtime import checkpoint as ckpt
from distlab.runtime.cut import TimedCadence, TimedCutCadence, checkpoint_cadence
from distlab.runtime.job import RankJob
from distlab.runtime.optim_state import gather_state, restore_state

# measured on the 2-core development machine (a 420 MB state: 0.20 s to snapshot on the training
# thread, 1.52 s of CPU to serialise, hash and write it on the writer's): what a checkpoint costs
# before the first is measured, and the writer's share after it
SNAPSHOT_SECONDS_PER_BYTE = 0.5e-9
WRITE_SECONDS_PER_BYTE = 3.5e-9
WRITE_SECONDS = 0.005  # any file: its fsyncs (10 ms of wall, 1 ms of CPU here) and the thread's start


class Checkpoints:
    """One rank's checkpoints over a run (none when ``job.checkpoint_dir`` is None)."""

    def __init__(
        self,
        job: RankJob,
        model: torch.nn.Module,
        sync: Any,
        units: list,
        batches: Any,
        store: Any,
        asynchronous: bool,
        extra: Any = None,
    ) -> None:
        """``extra``: a callable whose dict goes into each checkpoint as ``"user"`` (an own
        loop's scheduler, registered state and epoch: runtime/own_loop.py)."""
        self.job, self.model, self.sync, self.units, self.batches = job, model, sync, units, batches
        self.extra = extra
        on, every, budget = job.checkpoint_dir is not None, job.checkpoint_every, job.checkpoint_budget
        agree, estimate = self._agree, self._estimate
        self.cadence = (
            checkpoint_cadence(store, every, asynchronous, job.start_step, budget, agree, estimate)
            if on
            else None
        )
        self.writer = ckpt.Writer()
        self.last: Path | None = None
        self._since = (time.perf_counter(), job.start_step)  # the steps since the last checkpoint

    def _take(self, step: int, samples: int) -> None:
        t0 = time.perf_counter()
        self.last = _checkpoint(
            self.job, self.model, self.sync, self.units, step, samples, self.batches, self.writer, self.extra
        )
        assert self.cadence is not None
        self.cadence.served()
        if isinstance(self.cadence, TimedCadence) and step > self._since[1]:
            self.cadence.measured(step, self._cost(t0), (t0 - self._since[0]) / (step - self._since[1]))
            self._since = (time.perf_counter(), step)
        elif isinstance(self.cadence, TimedCutCadence):  # its cost holds its wait for the other ranks
            self.cadence.measured(step, self._cost(t0))

    def _cost(self, t0: float) -> float:
        """A checkpoint begun at ``t0``: the training thread's part measured, the writer's (beside it,
        on the same cores) at its rate."""
        return time.perf_counter() - t0 + WRITE_SECONDS + self._state_bytes() * WRITE_SECONDS_PER_BYTE

    def _state_bytes(self) -> int:
        """What a checkpoint holds: the model's state and this rank's optimizer state."""
        tensors = list(self.model.state_dict().values())
        for opt in (self.sync.local_opt, self.sync.server_opt):
            for per_param in getattr(opt, "state", {}).values() if opt is not None else ():
                tensors += [v for v in per_param.values() if torch.is_tensor(v)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _estimate(self) -> float:
        """A checkpoint's cost before one was taken: its bytes at this machine's rates."""
        return WRITE_SECONDS + self._state_bytes() * (SNAPSHOT_SECONDS_PER_BYTE + WRITE_SECONDS_PER_BYTE)

    def _agree(self, cost: float, step_time: float) -> tuple[float, float]:
        """Every rank's largest checkpoint cost and step time (one all-reduce: ranks in lockstep)."""
        import torch.distributed as dist

        both = torch.tensor([cost, step_time], dtype=torch.float64, device=self.job.device)
        if dist.is_initialized() and self.job.world > 1:
            dist.all_reduce(both, op=dist.ReduceOp.MAX)
        return float(both[0]), float(both[1])

    def at_stop(self, step: int, samples: int) -> None:
        """A stop before ``step``: a resize resumes exactly here (an asynchronous run: after its
        furthest rank, through one last cut)."""
        c = self.cadence
        if c and (c.asynchronous or step > self.job.start_step):
            c.stop()
            while c.pending():  # a cut asked before the stop, not yet joined, comes first
                self._take(step, samples)

    def after_step(self, steps_done: int, samples: int) -> None:
        if self.cadence and self.cadence.due(steps_done):
            self._take(steps_done, samples)

    def at_end(self, samples: int, step: int | None = None) -> None:
        """This rank has done its steps (``step``: how many; the job's by default): join a cut
        asked before its end (its askers wait for it)."""
        if self.cadence:
            self.cadence.close()
            while self.cadence.pending():
                self._take(self.job.steps if step is None else step, samples)

    def wait(self) -> str | None:
        """The last checkpoint is on disk; its path."""
        self.writer.wait()
        return str(self.last) if self.last else None

    def close(self) -> None:
        self.writer.close()


def resume(job: RankJob, model: torch.nn.Module, sync: Any, units: list, batches: Any) -> dict[str, Any]:
    """The checkpoint ``job.resume_from`` into the model, the optimizers and the batch state;
    returns the checkpoint (an own loop restores its ``"user"`` part)."""
    state = ckpt.load(job.resume_from)
    load_model_state(model, state, job.resume_from)
    sync.refresh_shadows()
    restore_state(sync.local_opt, units, state["optimizer"])
    restore_state(sync.server_opt, units, state["optimizer"])
    if sync.stale is not None:  # the servers reloaded before any rank pushes: a barrier
        restore_state(sync.stale.optimizer, units, state["optimizer"], sync.stale.targets())
        sync.settle()
    batches.load_state_dict(state.get("adaptive"))
    return state


def load_model_state(model: torch.nn.Module, state: dict[str, Any], path: str) -> None:
    """The checkpoint's weights into ``model``, or one error naming what does not match."""
    saved = state.get("model") or {}
    own = model.state_dict()
    missing = sorted(set(own) - set(saved))
    extra = sorted(set(saved) - set(own))
    shapes = [k for k in own if k in saved and tuple(own[k].shape) != tuple(saved[k].shape)]
    if missing or extra or shapes:
        what = "; ".join(
            part
            for part in (
                f"missing {missing[:3]}" if missing else "",
                f"unexpected {extra[:3]}" if extra else "",
                f"shape of {shapes[0]}: {tuple(saved[shapes[0]].shape)} saved, {tuple(own[shapes[0]].shape)} "
                "here"
                if shapes
                else "",
            )
            if part
        )
        raise LaunchError(
            f"RankJob.resume_from: checkpoint {path} was written by another model ({what}); resume it "
            f"with the model that wrote it ({type(model).__name__} here)"
        )
    model.load_state_dict(saved)


def _checkpoint(
    job: RankJob,
    model: torch.nn.Module,
    sync: Any,
    units: list,
    step: int,
    samples: int,
    batches: Any,
    writer: ckpt.Writer,
    extra: Any = None,
) -> Any:
    step, samples = sync.settle(step, samples)  # a stale PS: every push applied, every replica equal
    stale = (sync.stale.optimizer, sync.stale.targets()) if sync.stale is not None else None
    opt_state = gather_state(sync.local_opt, sync.server_opt, units, job.rank, job.world, stale)
    if job.rank != 0:
        return None
    payload = {
        "step": step,
        "samples": samples,
        "world": job.world,
        "run_id": job.run_id,
        "strategy": job.strategy.to_json(indent=None),
        "model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
        "optimizer": opt_state,
        "adaptive": batches.state_dict(),
    }
    if extra is not None:
        payload["user"] = extra()
    return writer.submit(job.checkpoint_dir, payload)  # the training goes on while it is written
