"""Keras 3 models launched on distlab's torch runtime (the torch backend on the workers)."""

from __future__ import annotations

import pytest
from keras_scripts import BUILDERS, TIMEOUT, result

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT + 60)]  # the first test waits for them all


def test_allreduce_on_two_ranks_equals_one_process_on_the_global_batch(torch_notebook):
    out = result(torch_notebook, "torch_equivalence")
    assert out["status"] == "finished" and out["type"] == "keras.Sequential"  # run.model is a Keras model
    assert out["moved"] > 1e-3  # it trained
    assert out["max_weight_difference"] < 1e-5, out
    assert out["tensorflow_on_workers"] == [False, False]  # no TensorFlow start-up, log or memory there
    assert out["untouched"]  # the user's model keeps its weights: the workers trained copies


def test_every_kind_of_builder_trains_a_keras_model_built_under_tensorflow(tensorflow_notebook):
    """The notebook's Keras on TensorFlow (a plain ``import keras``): the workers load each model's
    .keras file under torch, and run.model comes back as the notebook's Keras model."""
    out = result(tensorflow_notebook, "builders")
    for name in BUILDERS:
        assert out[name]["status"] == "finished" and out[name]["keras"] and out[name]["world"] == 2, (
            name,
            out[name],
        )
        assert out[name]["last"] == out[name]["last"]  # a number: the loss was computed
    assert out["magics_profile"] == out["variables"], out["magics_profile"]
    assert out["foreign_passes_on"] and 'inside `if __name__ == "__main__":`' in out["foreign_error"]
    assert out["zoo"]["status"] == "finished" and out["zoo"]["data"].startswith("synthetic")
    assert out["zoo"]["model"] == "keras_embedding"  # lab.runs names a Keras model by its own name
