"""distlab.runtime: execute a Strategy per rank with torch.distributed (gloo on CPU, NCCL on GPUs).

Kernels, one file each: ``allreduce`` (bucketed, overlapped), ``ps`` (parameter servers on
collectives), ``stale_ps`` (stale-synchronous and asynchronous servers on point-to-point
messages, a receiver thread per worker), ``allgather`` (sparse indices + values), ``gossip``
(neighbour averaging), ``compress`` (fp16/bf16 wire casts), composed per variable and shard by
``sync``; ``ddp`` is the fast path for pure all-reduce. ``trainer.run_rank`` is the entry point
the launcher calls; ``spawn.spawn_local`` runs ranks as local processes; ``checkpoint`` saves
and restores runs. Beside them: ``job`` (what a rank is given), ``data`` (its batches),
``adaptive`` and ``noise`` (an adaptive batch, the noise scale measured as it trains;
``noise_probe`` before a run, in this process), ``straggler`` (a slowdown or jitter asked for),
``trace`` (a rank's timeline), ``microbench``
and ``loopbench`` (calibration's measurements), ``process_group`` (rendezvous with a timeout),
``progress`` (ticks to the client).
"""

from __future__ import annotations

from typing import Any

from distlab.runtime.job import STEP_RECORD_KEYS, RankJob

__all__ = ["STEP_RECORD_KEYS", "RankJob", "run_rank", "spawn_local"]


def __getattr__(name: str) -> Any:  # torch.distributed is imported on first use only
    if name == "run_rank":
        from distlab.runtime.trainer import run_rank

        return run_rank
    if name == "spawn_local":
        from distlab.runtime.spawn import spawn_local

        return spawn_local
    raise AttributeError(f"module 'distlab.runtime' has no attribute {name!r}")
