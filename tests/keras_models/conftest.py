"""The Keras tests' scenarios, run in two processes (one per notebook backend: Keras fixes its
backend at its first import) that each start Keras and one Lab once (``keras_scripts.several``);
each test asserts on its scenario's result."""

from __future__ import annotations

import pytest
from keras_scripts import TENSORFLOW_CALLS, TIMEOUT, TORCH_CALLS, run


@pytest.fixture(scope="session")
def torch_notebook() -> dict:
    """Every torch-backend scenario's result."""
    return run("torch", "several", TORCH_CALLS, timeout=TIMEOUT)


@pytest.fixture(scope="session")
def tensorflow_notebook() -> dict:
    """Every TensorFlow-backend scenario's result."""
    return run("tensorflow", "several", TENSORFLOW_CALLS, timeout=TIMEOUT)
