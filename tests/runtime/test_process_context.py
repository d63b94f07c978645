"""How distlab starts processes (runtime/spawn.py ``process_context``): from a forkserver that
imported torch once, its children starting with SIGINT ignored until they take it back."""

from __future__ import annotations

import signal
import sys

import pytest

from distlab.runtime.spawn import PRELOAD, process_context, spawn_local


def _handler_and_torch(queue) -> None:
    queue.put((signal.getsignal(signal.SIGINT) == signal.SIG_IGN, "torch" in sys.modules))


def _rank_handler(rank: int, world: int, host: str, port: int) -> bool:
    return signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_importing_the_preload_outside_a_forkserver_leaves_sigint_alone():
    """A test that imports every module imported it into pytest's process once, and every stop
    test after it failed: the interrupt was ignored."""
    import importlib

    import distlab.runtime.forkserver_preload as preload

    importlib.reload(preload)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.skipif(sys.platform != "linux", reason="the forkserver is the Linux path here")
def test_a_child_starts_with_torch_imported_and_sigint_ignored_and_a_rank_takes_it_back():
    ctx = process_context()
    assert ctx.get_start_method() == "forkserver"
    queue = ctx.Queue()
    child = ctx.Process(target=_handler_and_torch, args=(queue,))
    child.start()
    ignored, preloaded = queue.get(timeout=60)
    child.join(10)
    assert ignored and preloaded, (ignored, preloaded, PRELOAD)
    # spawn_local's ranks answer the stop button again (the parent kills them on its interrupt)
    assert spawn_local(2, _rank_handler, timeout=60) == [True, True]
