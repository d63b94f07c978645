"""The kernel's interrupt (SIGINT: Ctrl-C, the notebook's stop button) held while a cluster starts
or stops: pressed half-way, it left worker processes no Lab held, or killed a worker being spawned."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def interrupts_held(reraise: bool = True) -> Iterator[list[int]]:
    """Hold SIGINT in the body (a cluster starting or stopping must not stop half-way), then, when
    ``reraise``, raise the ``KeyboardInterrupt`` it held; yields the list of signals held. Off the
    main thread, where no signal handler can be set, the body runs as is."""
    pressed: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed and reraise:
        raise KeyboardInterrupt


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread while the cluster starts, so the threads it starts (its event
    loop, whose threads spawn every worker process, replacements too) keep it blocked, and so do
    the processes they spawn: a worker starts in the kernel's process group and leaves it only once
    its preload runs (``dask_setup``), and the stop button pressed in between killed it ("Nanny
    failed to start"). The interrupt itself goes to a thread that does not block it (or waits
    until this one unblocks) and reaches ``interrupts_held``'s handler."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
