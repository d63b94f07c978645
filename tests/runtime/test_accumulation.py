"""Gradient accumulation and learning-rate scaling run as ``Strategy.batch`` says: 2 ranks x batch b
x k micro-batches train exactly like one process on the global batch 2·b·k (at the scaled rate)."""

from __future__ import annotations

import pytest
import torch
from runtime_bodies import ACCUMULATION_CASES as CASES
from runtime_bodies import EQUIVALENCE_STEPS as STEPS
from runtime_bodies import case_flags, lr_gain, reference_weights

from distlab.adaptive import scaling
from distlab.errors import LaunchError
from distlab.runtime.data import RankBatches


@pytest.mark.slow
@pytest.mark.timeout(600)  # waits for conftest.py's spawn of every equivalence case
@pytest.mark.parametrize("world", [1, 2])
def test_accumulation_and_scaling_match_one_process_on_the_global_batch(world, equivalence_ranks):
    results = equivalence_ranks(world)
    failures = []
    for key in CASES:
        acc = case_flags(key[0])[1].get("acc", 1)
        ref = reference_weights(key[1], key[2], STEPS, world, acc, lr_gain(key[0], world))
        if acc > 1:  # the test data must tell a step of b*k from k steps of b
            plain = reference_weights(key[1], key[2], STEPS * acc, world, 1, lr_gain(key[0], world))
            assert max((plain[k] - ref[k]).abs().max().item() for k in ref) > 1e-3, key
        for r in range(world):
            got = results[r][key]
            assert got["steps"] == STEPS  # optimizer steps, not micro-batches
            err = max((got["weights"][k] - ref[k]).abs().max().item() for k in ref)
            if err > 1e-5:
                failures.append(f"{key} rank {r}: max |w - w_ref| = {err:.2e}")
    assert not failures, "\n".join(failures)


def test_each_rank_reads_its_micro_batches_and_the_step_covers_the_global_batch_once():
    data = list(range(48))
    seen = []
    for rank in range(2):
        rb = RankBatches(
            torch.utils.data.TensorDataset(torch.arange(48), torch.arange(48)), 4, rank, 2, False, 0, 3
        )
        assert rb.global_batch == 24
        for micro in range(3):
            seen += rb.get(24, micro)[0].tolist()
    assert sorted(seen) == data[24:48]


def test_scaling_rules_and_their_gains():
    assert scaling.fixed_gain("none", 8) == 1.0
    assert scaling.fixed_gain("linear", 8) == 8.0
    assert scaling.fixed_gain("sqrt", 9) == pytest.approx(3.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with scaling.scaled([opt, None], 4.0):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.4)
    assert opt.param_groups[0]["lr"] == 0.1  # a scheduler between steps sees the base rate


def test_a_rule_the_runtime_does_not_run_or_an_optimizer_without_a_rate_is_one_error():
    assert scaling.check_rule("adascale") == "adascale"
    with pytest.raises(LaunchError, match=r"'cubic' is not a scaling rule"):
        scaling.check_rule("cubic")

    class NoRate(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"momentum": 0.9})

    with pytest.raises(
        LaunchError, match=r"NoRate has no numeric 'lr' in parameter group 0 .*use lr_scaling='none'"
    ):
        scaling.check_optimizer(NoRate([torch.nn.Parameter(torch.zeros(1))]), "linear")
    scaling.check_optimizer(NoRate([torch.nn.Parameter(torch.zeros(1))]), "none")


def test_only_the_last_micro_batch_launches_the_gradient_work():
    from runtime_bodies import MODELS, strategy_for

    from distlab.runtime.plan import build_units
    from distlab.runtime.sync import Synchronizer

    model = MODELS["dense"]()
    st = strategy_for("builder:AllReduce", model, 2)
    # world 2 in the plan, one rank here: the hooks' bookkeeping, not the collectives, is checked
    sync = Synchronizer(model, build_units(model, st, 2), lambda ps: torch.optim.SGD(ps, lr=0.1), 0, 1)
    x = torch.randn(4, next(model.parameters()).shape[1])
    sync.zero_grad()
    with sync.micro(last=False):
        model(x).sum().backward()
    assert sync.launched == 0  # a micro-batch before the last: gradients only accumulate
    with sync.micro(last=True):
        model(x).sum().backward()
    assert sync.launched == len(sync.tasks) > 0
    sync.close()
