"""Every non-gossip strategy trains exactly like one process on the global batch (1, 2 and 3 ranks;
one rank takes the runtime's no-collective path)."""

from __future__ import annotations

import pytest
import torch
from runtime_bodies import BATCH, MODELS, dataset, optimizer_factory, reference_weights
from runtime_bodies import EQUIVALENCE_CASES as CASES
from runtime_bodies import EQUIVALENCE_STEPS as STEPS

from distlab.runtime.data import RankBatches
from distlab.runtime.trainer import default_loss


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
@pytest.mark.timeout(600)  # waits for conftest.py's spawn of every equivalence case
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_strategy_matches_single_process_training(world, equivalence_ranks):
    results = equivalence_ranks(world)
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
