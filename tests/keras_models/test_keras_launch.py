"""Keras 3 models launched on distlab's torch runtime (the torch backend on the workers)."""

from __future__ import annotations

import pytest
from keras_scripts import run

pytestmark = pytest.mark.slow


@pytest.mark.timeout(400)
def test_allreduce_on_two_ranks_equals_one_process_on_the_global_batch():
    out = run("torch", "torch_route_equivalence", "AllReduce", timeout=380)
    assert out["status"] == "finished" and out["type"] == "keras.Sequential"  # run.model is a Keras model
    assert out["moved"] > 1e-3  # it trained
    assert out["max_weight_difference"] < 1e-5, out
    assert out["untouched"]  # the user's model keeps its weights: the workers trained copies
