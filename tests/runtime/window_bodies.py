"""Rank bodies for the window tests (spawned processes import them from here)."""

from __future__ import annotations

import datetime
import random
import time
from typing import Any

import torch
import torch.distributed as dist

from distlab.errors import WindowError

GOSSIP_WORLD = 4  # ranks of gossip_ranks_body's spawn (conftest.py)
# async_gossip_body's pure averaging runs: at 30 steps a run lasted 60-120 ms (a step of this tiny
# model is 2-4 ms), so a rank descheduled for that long on 2 shared cores let the others finish
# before it mixed (two whole-suite runs ended push-sum on one_peer_exp2 at 0.06 and 0.09 of the
# spread, against the bound 0.01; alone, 0 to 0.0013 in 17 runs); at 300 a run lasts about a second
AVERAGING_STEPS = 300


def _init(rank: int, world: int, addr: str, port: int, tag: str) -> None:
    store = dist.PrefixStore(tag, dist.TCPStore(addr, port, world + 1, False))
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )


def _error(fn: Any) -> str | None:
    try:
        fn()
    except WindowError as exc:
        return str(exc)
    return None


def push_sum_average(windows: Any, topo: Any, rank: int, steps: int) -> dict:
    """Push-sum with no gradient, ranks at uneven random paces: every rank's z / p, the mass."""
    from distlab.runtime.async_gossip import neighbours

    ins, outs = neighbours(topo, rank)
    x0 = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    w = windows.create("x", x0, ins, outs, method="push_sum")
    rng = random.Random(rank)
    handle = None
    for _ in range(steps):
        time.sleep(rng.random() * 0.004 * (1 + rank))  # rank 3 is four times slower than rank 0
        if handle is not None:
            handle.wait()
        handle = w.accumulate()
        w.update_then_collect()
    handle.wait()
    windows.finish()
    w.update_then_collect()
    return {"value": w.value(), "x0": x0, "p": w.p, "z": w.tensor.clone()}


def window_body(rank: int, world: int, addr: str, port: int) -> dict:
    """Every window operation on a ring of ``world`` ranks, then push-sum averaging on exp2."""
    from distlab import topology
    from distlab.runtime.window import Windows

    _init(rank, world, addr, port, "win")
    out: dict[str, Any] = {}
    ws = Windows(rank, world, timeout=30.0)
    left, right = (rank - 1) % world, (rank + 1) % world
    own = torch.full((5,), float(rank))
    avg = ws.create("avg", own, in_neighbors=[left], out_neighbors=[right])
    # put: rank r overwrites its buffer on r+1, twice (the second wins), with a weight
    avg.put(own * 10, dst_weights={right: 1.0}).wait()
    avg.put(dst_weights={right: 0.5}).wait()
    ws.settle()  # every message sent has landed (a finished send is across, not yet applied)
    out["put"] = (avg.version(), avg.buffers[left].clone())
    out["update"] = avg.update(0.25, {left: 0.75}).clone()  # 0.25 r + 0.75 * 0.5 (r - 1)
    out["version after update"] = avg.version()
    dist.barrier()
    # accumulate: two adds land as their sum
    acc = ws.create("acc", torch.zeros(3), in_neighbors=[left], out_neighbors=[right])
    acc.accumulate(torch.ones(3)).wait()
    acc.accumulate(torch.full((3,), 2.0), dst_weights={right: 2.0}).wait()
    ws.settle()
    out["accumulate"] = (acc.buffers[left].clone(), acc.version())
    # get: fetch the in-neighbour's current value
    avg.get()
    out["get"] = avg.buffers[left].clone()
    dist.barrier()
    # the mutex: rank 0 holds rank 1's for 0.5 s; rank 1's update with the mutex waits for it
    if rank == 0:
        with avg.mutex([1]):
            t_held = time.monotonic()
            dist.barrier()
            time.sleep(0.5)
        out["held"] = t_held
    else:
        dist.barrier()
        if rank == 1:
            t0 = time.monotonic()
            avg.update(1.0, {left: 0.0}, require_mutex=True)
            out["mutex wait"] = time.monotonic() - t0
    dist.barrier()
    out["errors"] = {
        "twice": _error(lambda: ws.create("avg", own, [left], [right])),
        "sum": _error(lambda: avg.update(0.5, {left: 0.7})),
        "not out": _error(lambda: avg.put(dst_weights={(rank + 2) % world: 1.0})),
        "push-sum put": _error(lambda: ws.create("ps", own, [left], [right], method="push_sum").put()),
        "push-sum weights": _error(lambda: ws["ps"].accumulate(self_weight=0.5, dst_weights={right: 0.2})),
        "push-sum no mass": _error(lambda: ws["ps"].accumulate(self_weight=0.0, dst_weights={right: 1.0})),
        "push-sum update": _error(lambda: ws["ps"].update(0.5, {left: 0.5})),
        "no in-neighbour": _error(lambda: ws.create("lonely", own, [], [right])),
        "push-sum get": _error(lambda: ws["ps"].get()),
        "push-sum copies": _error(
            lambda: ws.create("ps2", own, [left], [right], "push_sum", zero_init=False)
        ),
    }
    ws.finish()
    out["threads after finish"] = ws.alive()
    # push-sum averaging on a static exp2 graph, no gradient
    ws2 = Windows(rank, world, timeout=30.0)
    out["push-sum"] = push_sum_average(ws2, topology.get("exp2", world), rank, steps=60)
    out["push-sum threads"] = ws2.alive()
    # a directed graph outliving the group's timeout: on exp2 rank r never hears from r+1 but
    # through its heartbeats, and a receiver thread's wait is bounded by the timeout (2 s here)
    ws3 = Windows(rank, world, timeout=2.0)
    graph = topology.get("exp2", world)
    w3 = ws3.create("long", torch.ones(4), graph.in_neighbors(rank), graph.out_neighbors(rank), "push_sum")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5.0:
        w3.accumulate().wait()
        w3.update_then_collect()
        ws3.heartbeat()
        time.sleep(0.05)
    ws3.finish()
    w3.update_then_collect()
    out["outlived the timeout"] = (time.monotonic() - t0, w3.p, ws3.alive())
    out["mutex timeout"] = _mutex_timeout(rank, world)
    dist.destroy_process_group()
    return out


def _mutex_timeout(rank: int, world: int) -> dict:
    """On a ring with a 2 s timeout: rank 0 holds rank 1's mutex for 3 s; rank 2's lock of it
    gives up after 2 s with one line and leaves rank 1's queue; once rank 0 lets go, rank 2 takes
    it at once (had it stayed queued, rank 1 would have granted it to a rank no longer waiting)."""
    from distlab.runtime.window import Windows

    ws = Windows(rank, world, timeout=2.0)
    left, right = (rank - 1) % world, (rank + 1) % world
    w = ws.create("m", torch.zeros(2), [left], [right])
    out: dict[str, Any] = {}
    dist.barrier()

    def alive(seconds: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            ws.heartbeat()
            time.sleep(0.05)

    if rank == 0:
        ws.lock(w, 1)
        alive(3.0)
        ws.unlock(w, 1)
    elif rank == 2:
        time.sleep(0.3)
        t0 = time.monotonic()
        out["error"] = _error(lambda: ws.lock(w, 1))
        out["gave up after"] = time.monotonic() - t0
        alive(1.0)
    else:
        alive(3.2)
    dist.barrier()
    if rank == 2:
        t0 = time.monotonic()
        ws.lock(w, 1)
        out["took it in"] = time.monotonic() - t0
        ws.unlock(w, 1)
    alive(0.3)
    dist.barrier()
    if rank == 1:
        out["queue"], out["holder"] = list(w.queue), w.holder
    ws.finish()
    return out


def async_gossip_body(rank: int, world: int, addr: str, port: int, digits_steps: int) -> dict:
    """Asynchronous gossip through the trainer: pure averaging with the last rank slowed 2x
    (push-sum on exp2 and one-peer exp2, and neighbour averaging), then digits training."""
    from runtime_bodies import averaging_body, digits_body

    slow = {world - 1: 2.0}
    return {
        "push_sum exp2": averaging_body(rank, world, addr, port, "exp2", AVERAGING_STEPS, "push_sum", slow),
        "push_sum one_peer_exp2": averaging_body(
            rank, world, addr, port, "one_peer_exp2", AVERAGING_STEPS, "push_sum", slow
        ),
        "average exp2": averaging_body(rank, world, addr, port, "exp2", AVERAGING_STEPS, "average", slow),
        "digits": digits_body(
            rank,
            world,
            addr,
            port,
            ["allreduce", "gossip:exp2:push_sum", "gossip:exp2:average", "gossip:one_peer_exp2:push_sum"],
            digits_steps,
        ),
    }


def async_ends_body(rank: int, world: int, addr: str, port: int, directory: str) -> dict:
    """An asynchronous push-sum run's ends: checkpoints every 2 steps and a resume from step 2,
    then a cancel; the window threads left after each."""
    import threading

    from runtime_bodies import checkpoint_body, stop_body

    def threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("distlab-window")]

    ckpt = checkpoint_body(rank, world, addr, port, directory, "gossip:exp2:push_sum")
    after_ckpt = threads()
    stop = stop_body(rank, world, addr, port, "gossip:exp2:push_sum")
    return {"checkpoint": ckpt, "stop": stop, "threads": after_ckpt + threads()}


def gossip_ranks_body(
    rank: int, world: int, addr: str, port: int, sync_digits_steps: int, async_digits_steps: int
) -> dict:
    """Synchronous gossip, asynchronous gossip and the window operations in one set of processes
    (conftest.py's ``gossip_ranks``: a spawn of 4 ranks costs seconds of imports on 2 cores), each
    part on a store of its own: two parts' runs of one name (both train digits under "allreduce")
    would otherwise meet the other's rendezvous keys and connect to ranks no longer listening."""
    from runtime_bodies import gossip_suite_body

    parts = {
        "sync": lambda p: gossip_suite_body(rank, world, addr, p, sync_digits_steps),
        "async": lambda p: async_gossip_body(rank, world, addr, p, async_digits_steps),
        "windows": lambda p: window_body(rank, world, addr, p),
    }
    shared = dist.TCPStore(addr, port, world + 1, False)
    servers, out = [], {}
    for name, part in parts.items():
        if rank == 0:  # rank 0 hosts the part's store and says where
            servers.append(dist.TCPStore(addr, 0, world, True, wait_for_workers=False))
            shared.set(f"{name}-port", str(servers[-1].port))
        out[name] = part(int(shared.get(f"{name}-port")))
    # rank 0's stores end with its process: it leaves only when every rank has finished
    shared.add("finished", 1)
    while shared.add("finished", 0) < world:
        time.sleep(0.05)
    return out
