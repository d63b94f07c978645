"""Where GPU ranks go, checked without a GPU: more workers than GPUs take the devices in turn, and
ranks that share one exchange over gloo (NCCL refuses two ranks on one device)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from distlab.runs.train import _backend
from distlab.strategy.types import RankSpec, Strategy


def _job(devices: list[str], backend: str = "auto"):
    ranks = tuple(RankSpec(i, "127.0.0.1", d) for i, d in enumerate(devices))

    @dataclasses.dataclass
    class Job:
        strategy: Strategy

    return Job(Strategy((), ranks, backend=backend))


@pytest.mark.parametrize(
    ("devices", "backend", "expected"),
    [
        (["gpu:0", "gpu:0"], "auto", "gloo"),
        (["gpu:0", "gpu:1"], "auto", "auto"),
        (["cpu:0", "cpu:1"], "auto", "auto"),
        (["gpu:0", "gpu:0"], "gloo", "gloo"),
    ],
)
def test_ranks_sharing_a_gpu_use_gloo(devices, backend, expected):
    assert _backend(_job(devices, backend)) == expected


def _visible() -> str | None:
    return os.environ.get("CUDA_VISIBLE_DEVICES")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_workers_beyond_the_gpus_take_them_in_turn_replacements_too():
    from distributed import Client

    from distlab.cluster.local import SharedGPUCluster

    with (
        SharedGPUCluster(
            ["0", "1"],
            n_workers=3,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            silence_logs=50,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(3, timeout=60)
        seen = client.run(_visible)
        assert sorted(seen.values()) == ["0", "0", "1"]
        gone = next(a for a, v in seen.items() if v == "1")
        name = next(n for n, w in cluster.scheduler.workers.items() if n == gone)
        cluster.worker_spec.pop(cluster.scheduler.workers[name].name)
        cluster.sync(cluster._correct_state)
        cluster.scale(3)
        client.wait_for_workers(3, timeout=60)
        assert sorted(client.run(_visible).values()) == ["0", "0", "1"]
