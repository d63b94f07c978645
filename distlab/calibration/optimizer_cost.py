"""The optimizers' cost per parameter tensor, timed on a worker: what an update costs beside its bytes.

An update steps each parameter tensor in Python with a few kernel launches (Keras's Adam: a step
counter and eight in-place operations), so a model of many small tensors pays per tensor what a
per-byte figure over one large tensor does not show (the DLRM mixture's 5 ms steps: about 16
tensors). ``time_per_tensor`` times each optimizer the launch runs over ``TENSORS`` small tensors
and over one tensor of the same bytes, interleaved; the difference over ``TENSORS - 1`` is its
cost per tensor (``CostParams.sgd_tensor``, ``momentum_tensor``, ``adam_tensor``).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from distlab.costmodel.rows import CollectiveRow

if TYPE_CHECKING:
    from distlab.cluster.cluster import Cluster

TENSORS, NUMEL, REPEATS = 64, 256, 31  # 64 tensors of 1 KiB: the bytes' share is nothing


def make_optimizer(kind: str, params: list[Any]) -> Any:
    """The optimizer a run of ``kind`` steps with: the runtime's plain SGD (the training-loop stage's
    reference runs), the launch's momentum SGD, the launch's default Adam (Keras's update rule)."""
    from distlab.conventions import DEFAULT_OPTIMIZER, OptimizerSpec
    from distlab.runtime.trainer import default_optimizer

    if kind == "sgd":
        return default_optimizer(params)
    if kind == "momentum":
        return OptimizerSpec("sgd", (("momentum", 0.9),))(params)
    return DEFAULT_OPTIMIZER(params)


def time_per_tensor(kinds: tuple[str, ...] = ("sgd", "momentum", "adam")) -> list[dict[str, Any]]:
    """``optimizer_tensor:<kind>`` rows (``CollectiveRow`` dicts): seconds per tensor of each kind,
    on one thread: its work is serial dispatch, and a second thread's OpenMP spin between the
    small operations only adds noise (on a loaded 2-core host: 17 ms against 1.8 ms for Adam over
    64 tensors)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _time_kinds(kinds)
    finally:
        torch.set_num_threads(threads)


def _time_kinds(kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    import torch

    rows = []
    for kind in kinds:
        many = [torch.nn.Parameter(torch.zeros(NUMEL)) for _ in range(TENSORS)]
        one = [torch.nn.Parameter(torch.zeros(NUMEL * TENSORS))]
        for p in [*many, *one]:
            p.grad = torch.ones_like(p)
        steps = make_optimizer(kind, many).step, make_optimizer(kind, one).step
        for step in steps:  # the state tensors made, the first calls' costs paid
            step()
            step()
        per = []
        for _ in range(REPEATS):
            t = []
            for step in steps:
                t0 = time.perf_counter()
                step()
                t.append(time.perf_counter() - t0)
            per.append((t[0] - t[1]) / (TENSORS - 1))
        seconds = max(statistics.median(per), 0.0)
        rows.append(
            CollectiveRow(
                collective=f"optimizer_tensor:{kind}", world=1, seconds=seconds, repeats=REPEATS
            ).to_dict()
        )
    return rows


def measure_optimizer_tensors(cluster: Cluster) -> list[dict[str, Any]]:
    """``time_per_tensor`` on the first worker, alone (the other workers idle): about a second."""
    worker = cluster.first(1)[0]
    return cluster.client.submit(time_per_tensor, workers=[worker], pure=False).result()
