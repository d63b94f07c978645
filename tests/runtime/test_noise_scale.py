"""The gradient noise scale measured live on the noisy quadratic, where it is known: phi = d s^2 / |w -
mu|^2."""

from __future__ import annotations

import pytest
from runtime_bodies import noise_body

from distlab.runtime.spawn import spawn_local

STEPS = 2000
PHI = 64.0  # d = 64, s^2 = 1, |w - mu|^2 = 1


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2])
def test_the_noise_scale_is_within_15_percent_after_2000_steps(world):
    # per-replica batch x micro-batches: one micro-batch, and accumulation over two
    modes = [(16, 1), (8, 2), (8, 2, "adascale")]
    out = spawn_local(world, noise_body, modes, STEPS, timeout=280)
    for r in range(world):
        for b, k, *rule in modes:
            got = out[r][(b, k, *rule)]
            assert got["noise_scale"] == pytest.approx(PHI, rel=0.15), (world, b, k, got)
            assert got["global_batch"] == b * k * world
            m0, m = b, b * k * world  # efficiency of the global batch against the base (b)
            assert got["efficiency"] == pytest.approx((got["noise_scale"] + m0) / (got["noise_scale"] + m))
            # AdaScale's gain r = S x efficiency (S = m / m0): on the quadratic 2 x 72/80 at one rank,
            # 4 x 72/96 at two; the other rules leave the rate alone
            want = m / m0 * (PHI + m0) / (PHI + m) if rule else 1.0
            assert got["lr_gain"] == pytest.approx(want, rel=0.05)
            assert got["progress"] > 0
    assert out[0] == out[-1]  # every rank holds the same estimate


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_an_adaptive_run_changes_its_batch_only_at_epoch_boundaries_and_every_rank_alike():
    from runtime_bodies import adaptive_body

    n, steps = 256, 240
    out = spawn_local(2, adaptive_body, steps, n, timeout=180)
    recs = [
        [(r["step"], r["global_batch"], r["per_replica"], r["accumulation"], r["samples"]) for r in rank]
        for rank in out
    ]
    assert recs[0] == recs[1]  # the same decisions on both ranks
    pos = 0
    for (step, m, b, k, samples), nxt in zip(recs[0], recs[0][1:] + [None]):
        assert m == b * k * 2 and samples == pos + m  # the position advances by the step's global batch
        if nxt is not None and nxt[1] != m:
            assert pos // n != samples // n, f"batch changed after step {step}, not at an epoch boundary"
        pos = samples
    assert recs[0][0][1] == 8 and recs[0][-1][1] > 8  # it grew from the base toward the optimum (~128)
    assert all(r["lr_gain"] >= 1 for r in out[0]) and out[0][-1]["lr_gain"] > 1
