"""The NCCL path: the same equivalence checks with one GPU per rank (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

needs_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA devices"
)


@pytest.mark.gpu
@pytest.mark.slow
@needs_gpus
@pytest.mark.timeout(300)
def test_nccl_strategies_match_single_process_training():
    from runtime_bodies import nccl_equivalence_body, reference_weights

    from distlab.runtime.spawn import spawn_local

    cases = [
        ("builder:AllReduce", "dense", "adam"),
        ("mixed", "dense", "adam"),
        ("builder:Parallax", "sparse", "sgd"),
        ("allgather", "sparse", "sgd"),
    ]
    res = spawn_local(2, nccl_equivalence_body, cases, 3, timeout=280)
    for key in cases:
        ref = reference_weights(key[1], key[2], 3, 2)
        for r in range(2):
            w = res[r][key]["weights"]
            assert max((w[k].cpu() - ref[k]).abs().max().item() for k in ref) < 1e-4, (key, r)
