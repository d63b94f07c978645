"""(a preload of distlab's forkserver: ``spawn.PRELOAD``) SIGINT ignored in the server before it
forks, so each process it starts begins with SIGINT ignored too.

The stop button signals the notebook kernel's whole process group, the forkserver's children
included: a worker killed by it while it started was "Nanny failed to start". A worker takes
SIGINT back (``take_sigint_back``) once it has left that group (cluster/local.py ``dask_setup``),
a rank of spawn_local as it starts (spawn.py ``_child``). The server ignores SIGINT itself
(multiprocessing's own forkserver does), and its children take back what it had before that:
this. Imported anywhere else (a test importing every module), it changes nothing.
"""

import signal
import sys
import threading


def take_sigint_back() -> None:
    """(a process the forkserver started) SIGINT raises KeyboardInterrupt again, as in a process
    Python started itself (only the main thread may set a handler)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _in_forkserver() -> bool:
    """Whether multiprocessing's forkserver is importing this (its ``main`` runs the preloads)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


if _in_forkserver():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
