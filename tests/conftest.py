"""Fixtures shared across test folders."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests' own helpers (polling.py) import by name


@pytest.fixture
def one_thread():
    """Run a test with torch on one thread: timings on a shared 2-core machine are otherwise contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
