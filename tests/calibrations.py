"""Calibrations the tests share: what makes one cached whatever else the machine runs, and the
sizes of the one the notebooks and the browser test read (conftest.py's ``shared_calibration``)."""

from __future__ import annotations

import contextlib

import pytest

# the message sizes of the small calibrations the notebooks' and the browser's parameters ask for
# (tests/notebook/test_notebooks.py, tests/browser/test_jupyterlab.py): shared_calibration's
SHARED_SIZES = [4096, 65536]


@contextlib.contextmanager
def calibration_load_ignored():
    """A calibration that is cached whatever else the machine runs: other programs on a busy CI
    machine would mark it disturbed, and a disturbed one is never cached (cluster/load.py); nor
    would its repeats agree within REPEAT_LIMIT. Load detection and repeatability have tests of
    their own (test_load.py, tests/costmodel/test_repeatability.py, test_calibrate_repeat.py)."""
    from distlab import resources
    from distlab.calibration import repeat

    with pytest.MonkeyPatch.context() as mp:  # its own: a test's monkeypatch.undo() leaves it
        mp.setattr(resources, "DISTURBED_CORES", float("inf"))
        mp.setattr(repeat, "REPEAT_LIMIT", float("inf"))
        yield


@contextlib.contextmanager
def two_reference_models():
    """The calibration's training-loop stage on its first two reference models (an MLP under
    AllReduce, a deeper one under every builder) instead of all seven: for tests of what a
    calibration does with its result (warn, refuse to cache) rather than of what it fits, whose
    time is most of that stage's. test_calibrate checks the whole stage."""
    from distlab.calibration import campaign

    every = campaign.reference_cases
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(campaign, "reference_cases", lambda: every()[:2])
        yield
