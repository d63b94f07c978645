"""(worker) Progress from inside a rank's function: rank 0 ticks, the client's bar moves.

``Lab.run_ranks(..., on_tick=f)`` names a topic for the call; ``spmd.rank_entry`` hands it to
rank 0's process (``set_topic``), and ``tick(what)`` there logs one Dask worker event the client
passes to ``f``. Outside a rank (or on other ranks) ``tick`` does nothing.
"""

from __future__ import annotations

_TOPIC: str | None = None


def set_topic(topic: str | None) -> None:
    global _TOPIC
    _TOPIC = topic


def tick(what: str = "") -> None:
    """One unit of the rank's work done (``what``: which), for the client's progress bar."""
    if _TOPIC is None:
        return
    try:
        from distributed import get_worker

        get_worker().log_event(_TOPIC, {"tick": what})
    except (ImportError, ValueError):  # not in a Dask worker
        pass
