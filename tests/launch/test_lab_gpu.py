"""Lab(gpus=True) on this machine's GPUs: ranks train on CUDA (dask-cuda's one worker per GPU),
and more workers than GPUs share them over gloo. Skipped without CUDA."""

from __future__ import annotations

import importlib.util
import sys

import cloudpickle
import pytest
import torch

import distlab as dl

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs 1 CUDA device"),
]


def cuda_only_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy that fails the run if a rank (a Dask worker; launch checks the loss in this
    process first, on the CPU) computed anywhere but on a GPU."""
    from distributed import get_worker

    try:
        get_worker()
    except ValueError:
        return torch.nn.functional.cross_entropy(out, y)
    if not out.is_cuda:
        raise RuntimeError(f"rank trained on {out.device}, not on a GPU")
    return torch.nn.functional.cross_entropy(out, y)


def _train_digits(lab: dl.Lab) -> None:
    data = dl.data.digits()
    model = dl.data.digits_mlp()
    prof = dl.profile(model, sample_input=data.inputs[:32], batch_size=32)
    st = dl.strategy.build("AllReduce", prof, lab.resources, batch_size=32)
    run = lab.launch(
        model,
        strategy=st,
        data=data,
        steps=150,
        batch_size=32,
        loss=cuda_only_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    )
    run.wait()
    assert run.status == "finished", run.error
    r0 = run.metrics[run.metrics["rank"] == 0].sort_values("step")
    assert r0["loss"].iloc[-20:].mean() < 0.5 * r0["loss"].iloc[:20].mean()


@pytest.mark.skipif(importlib.util.find_spec("dask_cuda") is None, reason="needs dask-cuda")
def test_one_worker_per_gpu_trains_on_the_device():
    with dl.Lab(gpus=True) as lab:
        assert lab.resources.world == torch.cuda.device_count()
        assert all(r.device.startswith("gpu:") for r in lab.resources.ranks)
        _train_digits(lab)


def test_two_workers_share_one_gpu_over_gloo():
    with dl.Lab(torch.cuda.device_count() + 1, gpus=True) as lab:
        devices = [r.device for r in lab.resources.ranks]
        assert all(d.startswith("gpu:") for d in devices) and len(set(devices)) < len(devices), devices
        _train_digits(lab)
