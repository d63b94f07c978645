"""The Keras tests' scenarios, run in two processes at once (one per notebook backend: Keras fixes
its backend at its first import) that each start Keras and one Lab once (``keras_scripts.several``);
each test asserts on its scenario's result."""

from __future__ import annotations

import time

import pytest
from keras_scripts import TENSORFLOW_CALLS, TIMEOUT, TORCH_CALLS, finish, start


@pytest.fixture(scope="session")
def keras_notebooks() -> dict:
    """Both processes' results, ``{"torch": ..., "tensorflow": ...}``. The two run at once: each
    waits seconds on process starts, Keras's import and TensorFlow children, and the scenarios
    whose timings matter (a rank's exit, a deadline) measure seconds well inside their bounds."""
    procs = {
        "torch": start("torch", "several", TORCH_CALLS),
        "tensorflow": start("tensorflow", "several", TENSORFLOW_CALLS),
    }
    deadline = time.monotonic() + TIMEOUT  # for both: they run at once
    try:
        out = {
            k: finish(p, f"the {k} notebook's scenarios", max(deadline - time.monotonic(), 1))
            for k, p in procs.items()
        }
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for k, res in out.items():  # shown with -s: where the seconds go
        print(f"\n{k} notebook, seconds per scenario: {res['seconds']}")
    return out


@pytest.fixture(scope="session")
def torch_notebook(keras_notebooks) -> dict:
    """Every torch-backend scenario's result."""
    return keras_notebooks["torch"]


@pytest.fixture(scope="session")
def tensorflow_notebook(keras_notebooks) -> dict:
    """Every TensorFlow-backend scenario's result."""
    return keras_notebooks["tensorflow"]
