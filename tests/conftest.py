"""Fixtures shared across test folders, and which tests `make check` leaves out. Helpers shared
across folders are modules of the ``tests`` package (``from tests.polling import poll_for``); a
folder's own helpers sit beside its tests."""

import os
import shutil
import signal
import tempfile
import threading
import time

import pytest
import torch

from tests.calibrations import SHARED_SIZES, calibration_load_ignored

_CACHE = pytest.StashKey[tuple]()  # (the suite's cache folder, DISTLAB_CACHE_DIR before it)


def _own_cache(config) -> None:
    """The suite's own distlab cache folder (``DISTLAB_CACHE_DIR``, read by ``files.cache_home``),
    for this process and every kernel, notebook and JupyterLab it starts: a run never reads what
    an earlier run of the suite, or the developer's own notebooks, left in ``~/.cache/distlab``
    (a CI machine starts without one, and so does each run here), nor writes there."""
    folder = tempfile.mkdtemp(prefix="distlab-test-cache-")
    config.stash[_CACHE] = (folder, os.environ.get("DISTLAB_CACHE_DIR"))
    os.environ["DISTLAB_CACHE_DIR"] = folder


def pytest_unconfigure(config):
    folder, before = config.stash.get(_CACHE, (None, None))
    if folder is None:
        return
    if before is None:
        os.environ.pop("DISTLAB_CACHE_DIR", None)
    else:
        os.environ["DISTLAB_CACHE_DIR"] = before
    shutil.rmtree(folder, ignore_errors=True)


def pytest_configure(config):
    """SIGINT as an interactive Python has it: a shell that starts a command in the background
    (``make test &``, a CI step, a tool's job) leaves SIGINT ignored in it, and Python keeps an
    inherited SIG_IGN, so ``_thread.interrupt_main()`` (the stop button as the stop tests press it)
    did nothing: the three stop tests of test_stop_work failed in every whole run started that way
    and passed when run by hand (/proc/<pytest>/status: SigIgn 0x...1007, SIGINT's bit set).
    And the suite's own cache folder (``_own_cache``)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _own_cache(config)


@pytest.fixture
def one_thread():
    """Run a test with torch on one thread: timings on a shared 2-core machine are otherwise contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _stop_button_still_works():
    """Every test leaves SIGINT's handler as it found it: a handler left installed (one that holds
    the press, or dask-jobqueue's ``sys.exit()``) is a kernel whose stop button no longer raises
    KeyboardInterrupt. In one whole-suite run a handler left behind by an earlier test swallowed the
    interrupts of every test in test_stop_work, which failed far from the cause; this fails the
    test that left it, and puts the handler back for the tests after it."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if main and after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test left SIGINT's handler as {after!r} (it found {before!r}): stop would not stop")


def _run_threads_end(before: set[int], within: float = 10) -> None:
    """No run driver thread started since ``before`` (thread idents) outlives its run."""
    deadline = time.monotonic() + within
    while True:
        extra = [
            t.name
            for t in threading.enumerate()
            if t.ident not in before and t.is_alive() and t.name.startswith("distlab-run")
        ]
        if not extra or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not extra, f"run driver threads left behind: {extra}"


@pytest.fixture(scope="session")
def session_lab():
    """One 2-worker embedded Lab for the session: starting and stopping one costs 10-15 s on 2 busy
    cores, and each module that takes ``lab`` borrows this one."""
    from distlab.lab import Lab

    before = {t.ident for t in threading.enumerate()}
    lab = Lab(workers=2, timeout=20)
    yield lab
    lab.close()
    _run_threads_end(before)


@pytest.fixture(scope="session")
def shared_calibration(session_lab):
    """One calibration of the session's 2-worker embedded Lab at ``SHARED_SIZES``, cached in the
    suite's cache folder (``_own_cache``) by the product's own path, so that the notebooks and the
    JupyterLab quickstart, whose small parameters ask ``lab.calibrate(sizes=SHARED_SIZES, ...)`` on
    a ``dl.Lab(workers=2)`` of this machine, read the cluster's part from it and measure only their
    own models, as a user's second run of a notebook does. Each of those four calibrated from
    scratch (30-45 s each here): such small calibrations are never cached by themselves (their
    4-64 KiB fits disagree between repeats, and two benchmarks at once see each other as load).
    Calibrating from scratch is what test_calibrate, test_load, test_calibrate_repeat,
    test_polish and the README's own calibration (the default sizes) check."""
    import warnings

    from distlab.calibration.campaign import cache_key, calibrate_cluster
    from distlab.files import cache_home

    folder = cache_home()
    with calibration_load_ignored(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        calibrate_cluster(session_lab.cluster, folder, sizes=SHARED_SIZES, progress=False)
    path = folder / f"calibration-{cache_key(session_lab.resources, SHARED_SIZES)}.json"
    assert path.exists(), f"the shared calibration was not cached at {path}"
    return path


@pytest.fixture(scope="module")
def lab(session_lab):
    """The session's Lab as a new one looks to this module: no cost model, its first cache folder
    and timeout. Earlier modules' runs stay in its history (a module that needs a Lab of its own,
    or an empty history, defines its own ``lab``). At the module's end its unfinished runs are
    cancelled, as ``lab.close()`` would, and their driver threads must end."""
    from distlab.cluster.local import heal_local_cluster

    before = {t.ident for t in threading.enumerate()}
    cache_dir, timeout = session_lab.cache_dir, session_lab.timeout
    session_lab.cost_model = None
    # an earlier module may have killed a worker: whole again, as the Lab makes it before a launch
    heal_local_cluster(session_lab.cluster.local, session_lab.client, within=60)
    yield session_lab
    for run in session_lab.history:
        if not run.done:
            run.cancel()
    session_lab.cost_model, session_lab.cache_dir, session_lab.timeout = None, cache_dir, timeout
    _run_threads_end(before)


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


_DESELECTED = pytest.StashKey[int]()  # how many tests `-m` or `-k` left out of this session


def pytest_deselected(items):
    if items:
        stash = items[0].config.stash
        stash[_DESELECTED] = stash.get(_DESELECTED, 0) + len(items)


def pytest_sessionfinish(session, exitstatus):
    """A folder whose tests are all slow (tests/keras_models, tests/browser) under ``-m "not slow"``
    has nothing to run, which is an answer, not pytest's "no tests collected" failure (exit 5)."""
    marks = session.config.option.markexpr
    deselected = session.config.stash.get(_DESELECTED, 0)
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and marks and deselected:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"every test selected here is left out by -m {marks!r} "
                "(make test, or pytest without -m, runs them)"
            )
        session.exitstatus = pytest.ExitCode.OK
