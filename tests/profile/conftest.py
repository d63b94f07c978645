"""Profiler tests run single-threaded: timings under a shared 2-core machine are otherwise dominated by contention."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
