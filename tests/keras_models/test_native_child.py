"""The native route's TensorFlow child (native_tf/child.py) starts without what no rank uses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CHECK = """
import sys
from distlab.native_tf import child
tf = child._import_tensorflow()
print("tensorflow", tf.__name__, "sklearn" in sys.modules)
import sklearn  # a user's loss may still use it
print("sklearn", sklearn.__name__)
"""


def test_the_tensorflow_child_imports_tensorflow_without_scikit_learn_and_a_user_can_still_import_it():
    # a fresh process, as a rank's child is: Keras's scikit-learn wrappers are a fifth of its start
    out = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tensorflow tensorflow False" in out.stdout, out.stdout
    assert "sklearn sklearn" in out.stdout, out.stdout
