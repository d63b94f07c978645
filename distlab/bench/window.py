"""A window's put against a plain isend of the same bytes (the ``async-gossip`` benchmark's
second figure): two spawned ranks, the two interleaved and their order alternating by round."""

from __future__ import annotations

import datetime
import time
from typing import Any


def put_vs_isend_body(
    rank: int, world: int, addr: str, port: int, nbytes: int, rounds: int
) -> dict[str, list]:
    """(spawned rank) Rank 0 sends ``nbytes`` to rank 1 by a window put and by a plain isend,
    in alternating order; each is timed from the call until rank 1 has the bytes where it reads
    them (rank 1 answers each with a one-element send). Returns rank 0's seconds per kind."""
    import torch
    import torch.distributed as dist

    from distlab.runtime.window import Windows

    store = dist.PrefixStore("put-vs-isend", dist.TCPStore(addr, port, world + 1, False))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    torch.set_num_threads(1)
    n = nbytes // 4
    data = torch.randn(n)
    windows = Windows(rank, world, timeout=120.0)
    w = windows.create("bench", data, in_neighbors=[1 - rank], out_neighbors=[1 - rank])
    ack = torch.zeros(1)
    times: dict[str, list] = {"put": [], "isend": []}
    landed = 0
    buf = torch.zeros(n)
    try:
        for i in range(rounds):
            for kind in ("put", "isend") if i % 2 == 0 else ("isend", "put"):
                dist.barrier()
                if rank == 0:
                    t0 = time.perf_counter()
                    if kind == "put":
                        w.put().wait()
                    else:
                        dist.isend(data, 1, tag=5).wait()
                    dist.recv(ack, 1, tag=6)
                    times[kind].append(time.perf_counter() - t0)
                    continue
                if kind == "put":  # landed: the receiver thread has it in the neighbour's buffer
                    with w.lock:
                        while w.applied[0] < landed + 1:
                            w.lock.wait(0.0005)
                        landed += 1
                else:  # into a buffer allocated once, as the window's own are
                    dist.irecv(buf, 0, tag=5).wait()
                dist.send(ack, 0, tag=6)
        windows.finish()
    finally:
        windows.close()
        dist.destroy_process_group()
    return times


def put_vs_isend(nbytes: int = 25 * 2**20, rounds: int = 20, timeout: float = 300.0) -> dict[str, list]:
    """Seconds per put and per isend of ``nbytes`` between two fresh local ranks, ``rounds`` each."""
    from distlab.runtime.spawn import spawn_local

    return spawn_local(2, put_vs_isend_body, int(nbytes), int(rounds), timeout=timeout, threads=1)[0]


def summary(times: dict[str, list[Any]]) -> dict[str, float]:
    """Medians of each and the median of the rounds' put/isend ratios."""
    import statistics

    ratios = [p / s for p, s in zip(times["put"], times["isend"]) if s]
    return {
        "put_median_s": statistics.median(times["put"]),
        "isend_median_s": statistics.median(times["isend"]),
        "put_over_isend_median": statistics.median(ratios),
        "put_over_isend_max": max(ratios),
    }
