"""Checkpoints: atomic, checksummed, corrupt ones skipped; a resumed run ends where the uninterrupted one
does."""

from __future__ import annotations

import pytest
import torch
from runtime_bodies import checkpoint_body

from distlab.errors import LaunchError
from distlab.runtime import checkpoint
from distlab.runtime.spawn import spawn_local


def payload(step: int) -> dict:
    return {"step": step, "samples": 8 * step, "model": {"w": torch.full((3,), float(step))}, "optimizer": {}}


def test_save_load_roundtrip_and_latest(tmp_path):
    for s in (2, 4, 6):
        checkpoint.save(tmp_path, payload(s))
    assert checkpoint.latest(tmp_path).name == "ckpt-000000006.pt"
    back = checkpoint.load(checkpoint.latest(tmp_path))
    assert back["step"] == 6 and back["samples"] == 48
    assert torch.equal(back["model"]["w"], torch.full((3,), 6.0))
    assert not list(tmp_path.glob("*.tmp")), "temp files left behind"


def test_corrupt_newest_checkpoint_is_detected_and_previous_used(tmp_path):
    # a run keeps one checkpoint (the default); with two kept, a corrupt newest falls back
    checkpoint.save(tmp_path, payload(2), keep=2)
    newest = checkpoint.save(tmp_path, payload(4), keep=2)
    raw = bytearray(newest.read_bytes())
    raw[-10] ^= 0xFF  # one flipped byte in the payload
    newest.write_bytes(bytes(raw))
    with pytest.raises(LaunchError, match="checksum mismatch"):
        checkpoint.load(newest)
    assert checkpoint.latest(tmp_path).name == "ckpt-000000002.pt"
    newest.write_bytes(raw[:50])  # truncated
    assert checkpoint.latest(tmp_path).name == "ckpt-000000002.pt"


def test_keeps_only_the_newest_few(tmp_path):
    for s in range(1, 7):
        checkpoint.save(tmp_path, payload(s), keep=3)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.pt")) == [f"ckpt-00000000{s}.pt" for s in (4, 5, 6)]


def test_latest_of_missing_or_empty_directory_is_none(tmp_path):
    assert checkpoint.latest(tmp_path / "nope") is None
    assert checkpoint.latest(tmp_path) is None
    assert checkpoint.latest(None) is None


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["builder:PartitionedPS:servers=all", "builder:PartitionedAR"])
def test_resume_from_checkpoint_matches_uninterrupted_run(tmp_path, case):
    # Adam state of PS shards lives on two servers; the checkpoint gathers and re-slices it
    res = spawn_local(2, checkpoint_body, str(tmp_path), case, timeout=100)
    for r in range(2):
        assert res[r]["resumed_steps"] == [2, 3]
        err = max((res[r]["full"][k] - res[r]["resumed"][k]).abs().max().item() for k in res[r]["full"])
        assert err < 1e-6, f"rank {r}: resumed run is {err:.2e} away"
    assert res[0]["checkpoint"].endswith("ckpt-000000004.pt") and res[1]["checkpoint"] is None
    assert res[0]["samples"] == 16


@pytest.mark.slow
def test_a_checkpoint_of_another_model_is_one_error_naming_what_differs(tmp_path):
    from runtime_bodies import wrong_checkpoint_body

    msg = spawn_local(1, wrong_checkpoint_body, str(tmp_path), timeout=60)[0]
    assert (
        "was written by another model (missing" in msg and "resume it with the model that wrote it" in msg
    ), msg
