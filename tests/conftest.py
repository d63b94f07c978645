"""Fixtures shared across test folders, and which tests `make check` leaves out. Helpers shared
across folders are modules of the ``tests`` package (``from tests.polling import poll_for``); a
folder's own helpers sit beside its tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run a test with torch on one thread: timings on a shared 2-core machine are otherwise contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# What `make check` leaves out (`-m "not slow"`): the tests that start processes, clusters,
# notebooks, browsers or TensorFlow children. A test is slow when it says so, when it carries one
# of the tier markers, when it sits in one of these files or folders, or when it asks for one of
# these fixtures (each starts a Lab, a cluster or ranks).
_SLOW_MARKERS = ("notebook", "browser", "gpu")
_SLOW_PATHS = (
    "tests/browser/",
    "tests/keras_models/",
    "tests/notebook/test_notebooks.py",
    "tests/test_docs_examples.py",
)
_SLOW_FIXTURES = frozenset({"lab", "clean_lab", "hosts", "scheduler", "session_shell"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if (
            any(item.get_closest_marker(name) for name in _SLOW_MARKERS)
            or item.nodeid.startswith(_SLOW_PATHS)
            or _SLOW_FIXTURES.intersection(item.fixturenames)
        ):
            item.add_marker(pytest.mark.slow)
