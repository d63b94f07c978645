"""Profiler tests run single-threaded: timings under a shared 2-core machine are otherwise dominated by
contention."""

import pytest


@pytest.fixture(autouse=True)
def _single_threaded(one_thread):
    """Every test in this folder uses tests/conftest.py's ``one_thread``."""
    yield
