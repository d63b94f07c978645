"""Fixtures shared across test folders. Helpers shared across folders are modules of the ``tests``
package (``from tests.polling import poll_for``); a folder's own helpers sit beside its tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run a test with torch on one thread: timings on a shared 2-core machine are otherwise contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
