"""Keras users' conventions on both routes (distlab.conventions): Keras losses called as Keras
calls them, Keras optimizers and names carried to torch with their hyperparameters, and
``model.compile``'s loss and optimizer used when the launch gives none."""

from __future__ import annotations

import pytest
from keras_scripts import TIMEOUT, result

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT + 60)]  # the first test waits for them all


def test_keras_losses_and_optimizers_compute_as_keras_does(torch_notebook):
    out = result(torch_notebook, "conventions")
    for name, (keras_value, ours) in out["losses"].items():
        assert ours == pytest.approx(keras_value, rel=1e-5), name
    for name, (keras_weights, torch_weights) in out["optimizers"].items():
        assert torch_weights == pytest.approx(keras_weights, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize(
    ("backend", "route"), [("torch", "torch"), ("tensorflow", "tensorflow"), ("tensorflow", "torch")]
)
def test_a_keras_user_trains_with_keras_losses_and_compile_on_either_route(
    torch_notebook, tensorflow_notebook, backend, route
):
    """The notebook's Keras backend and the route: distlab's runtime from a notebook on torch, the
    native route, and distlab's runtime from a plain ``import keras`` (TensorFlow in the notebook,
    torch on the workers)."""
    key = {"torch": "user_flow", "tensorflow": f"user_flow_{route}"}[backend]
    out = result(torch_notebook if backend == "torch" else tensorflow_notebook, key)
    assert out["backend"] == backend
    for way, info in (
        ("name", "keras sparse_categorical_crossentropy()"),
        ("object", "keras sparse_categorical_crossentropy(from_logits=True)"),
    ):
        first, last = out[way]["losses"]
        assert out[way]["status"] == "finished" and first == pytest.approx(1.386, abs=0.05), out[way]
        assert last < 1.0, out[way]  # the label is a function of the first id: learnable
        assert out[way]["loss_info"] == info and out[way]["optimizer_info"] == "Adam(learning_rate=0.01)"
    compiled = out["compiled"]
    assert compiled["status"] == "finished", compiled["error"]
    assert out["trained_library"] == "keras" and out["user_model_untouched"]  # a Keras model back
    assert compiled["loss_info"] == "keras sparse_categorical_crossentropy() from model.compile"
    assert compiled["optimizer_info"] == "Adam(learning_rate=0.001) from model.compile"
    # compile's metrics=["accuracy"]: a column per step and a card row, as fit logs it
    assert compiled["metric_names"] == ["accuracy"] and "accuracy from model.compile" in compiled["card"]
    assert abs(compiled["train_accuracy"] - compiled["accuracy"]) < 0.1, compiled  # near held-out
    # a softmax classifier compiled with Keras's loss name, as accurate as Keras's own fit
    assert compiled["accuracy"] >= out["fit_accuracy"] - 0.03, (compiled, out["fit_accuracy"])
