"""Every non-gossip strategy trains exactly like one process on the global batch (1, 2 and 3 ranks;
one rank takes the runtime's no-collective path)."""

from __future__ import annotations

import pytest
import torch
from runtime_bodies import BATCH, MODELS, dataset, equivalence_body, optimizer_factory, reference_weights

from distlab.runtime.data import RankBatches
from distlab.runtime.spawn import spawn_local
from distlab.runtime.trainer import default_loss

STEPS = 4
CASES = [
    ("builder:AllReduce", "dense", "sgd"),  # distlab's bucketed kernel
    ("builder:AllReduce", "dense", "adam"),
    ("builder:AllReduce+ddp", "dense", "adam"),  # torch's DDP reducer (extra ddp=True)
    ("allreduce_own", "dense", "sgd"),  # two groups
    ("fp16", "dense", "sgd"),  # fp16 on the wire: close, not exact (checked with its own tolerance)
    ("builder:PS:servers=all", "dense", "sgd"),
    ("builder:PS:servers=all", "dense", "adam"),
    ("builder:PSLoadBalancing:servers=all", "dense", "adam"),
    ("builder:PartitionedPS:servers=all", "dense", "sgd"),
    ("builder:UnevenPartitionedPS:servers=all", "dense", "adam"),
    ("builder:PartitionedAR", "dense", "sgd"),
    ("builder:PartitionedAR", "dense", "adam"),
    ("builder:RandomAxisPartitionAR", "dense", "adam"),
    ("builder:Parallax", "dense", "adam"),
    ("mixed", "dense", "adam"),  # all kernels at once, PS shards on several servers
    ("mixed", "dense", "sgd"),
    # sparse embedding gradients (SGD: torch's Adam refuses sparse gradients, single-process too)
    ("builder:AllReduce", "sparse", "sgd"),
    ("builder:PS:servers=all", "sparse", "sgd"),
    ("builder:PartitionedPS:servers=all", "sparse", "sgd"),
    ("builder:Parallax", "sparse", "sgd"),
    ("allgather", "sparse", "sgd"),
    ("sparse_ps_partitioned", "sparse", "sgd"),
    ("mixed", "sparse", "sgd"),
    ("builder:PartitionedPS:servers=all+per_table", "sparse", "sgd"),  # one exchange per table
    ("mixed+per_table", "sparse", "sgd"),
]


def local_only_weights(model_kind: str, opt: str, world: int) -> dict[str, torch.Tensor]:
    """What rank 0 would reach without any synchronisation: the tolerance must be far below this."""
    model = MODELS[model_kind]()
    optim = optimizer_factory(opt)(list(model.parameters()))
    data = RankBatches(dataset(model_kind), BATCH, 0, world, True, 3)
    for t in range(STEPS):
        x, y = data.get(t * BATCH * world)
        optim.zero_grad()
        default_loss(model(x), y).backward()
        optim.step()
    return model.state_dict()


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_strategy_matches_single_process_training(world):
    results = spawn_local(world, equivalence_body, CASES, STEPS, timeout=200)
    failures = []
    for key in CASES:
        ref = reference_weights(key[1], key[2], STEPS, world)
        unsynced = local_only_weights(key[1], key[2], world)
        gap = max((unsynced[k] - ref[k]).abs().max().item() for k in ref)
        if world > 1:  # one rank is its own global batch
            assert gap > 1e-3, f"{key}: the test data cannot tell synchronised from local training"
        for r in range(world):
            got = results[r][key]
            assert got["steps"] == STEPS
            err = max((got["weights"][k] - ref[k]).abs().max().item() for k in ref)
            if err > (2e-3 if key[0] == "fp16" else 1e-5):
                failures.append(f"{key} rank {r}: max |w - w_ref| = {err:.2e}")
    assert not failures, "\n".join(failures)
