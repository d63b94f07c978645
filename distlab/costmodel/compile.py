"""Compile a (profile, strategy) pair once into the numbers the vectorised simulator needs.

The layout follows the runtime (``distlab/runtime/sync.py`` and ``ddp.py``) so that the
simulator charges each transfer where the runtime really performs it:

- during backward, in reverse parameter order: all-reduce buckets (each all-reduce group split
  at the bucket cap; torch DDP's 1 MiB first bucket and 25 MiB caps for a pure all-reduce
  strategy) and one ``reduce`` to its server per dense PS variable or shard, launched in order
  as soon as their gradients are ready, one after another on the process group;
- after backward: sparse exchanges (all-gather, or gather to the PS server) whose sizes are
  only known then;
- around the optimizer step: gossip (AWC starts before the step, ATC after it) and, after it,
  the servers' broadcasts of the new values.

Everything here is independent of the link figures and of the calibration, so the result is
cached per (profile, strategy) identity and reused for every evaluation, sweep and what-if.

Long because ``CompiledStrategy`` (one field per number the simulator reads), the tally of every sync
kind (as the runtime dispatches them) and the step that turns one into the other are one mapping,
each part naming the others' fields; the per-host traffic it hands to links.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from distlab.costmodel import links
from distlab.costmodel.compute import model_key
from distlab.costmodel.degree import strategy_in_degree
from distlab.profiling.model_profile import ModelProfile, VariableProfile
from distlab.strategy.execution import BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, ddp_applies
from distlab.strategy.types import Strategy, Sync

INDEX_BYTES = 8  # int64 row index sent with every sparse row


@dataclass(frozen=True)
class ProfileTiming:
    """Forward and backward seconds at the profiled batch, and when each gradient is ready."""

    fwd: float
    bwd: float
    ready: dict[str, float]  # variable -> fraction of backward done when its gradient is ready
    model_key: str = ""  # compute.model_key of the profile


@dataclass(frozen=True)
class CompiledStrategy:
    """One strategy on one profile as plain numbers (bytes on the wire, compressed where asked)."""

    name: str
    builder: str
    world: int
    per_replica: int
    accum: int
    fwd: float  # seconds of one micro-batch forward at per_replica, before contention
    bwd: float
    hosts: tuple[tuple[str, int], ...]  # ranks per host
    device_share: int  # most ranks sharing one accelerator (1 on CPU)
    gpu: bool
    profile_threads: int | None  # threads the profile's timings were measured with
    profile_thread_efficiency: float | None  # the model's own thread scaling; None: the params'
    multi_host: bool
    ddp: bool  # the runtime's DDP fast path (pure all-reduce)
    # backward tasks in launch order: an all-reduce bucket or a PS reduce each
    task_ar_bytes: np.ndarray  # per task, for inspection: all-reduce bytes on the wire
    task_red_bytes: np.ndarray  # per task: PS reduce bytes
    # the same tasks as suffix sums from each task to the last, keeping only tasks whose
    # readiness exceeds every earlier task's (the others can never end the timeline later)
    task_ready: np.ndarray  # fraction of backward when all of the task's gradients are ready
    suf_ar_calls: np.ndarray
    suf_ar_bytes: np.ndarray
    suf_red_calls: np.ndarray
    suf_red_bytes: np.ndarray
    # after backward: sparse all-gathers (per rank contribution) and sparse gathers to servers
    ag_bytes: float
    ag_calls: int
    sps_gather_bytes: float
    sps_gather_calls: int
    # after the optimizer step: dense broadcasts per server, sparse row broadcasts
    ps_bytes: np.ndarray  # per server
    ps_msgs: np.ndarray
    ps_worker_bytes: float  # most bytes one rank receives from servers other than itself
    sps_bcast_bytes: float
    sps_bcast_calls: int
    gossip_bytes: float
    gossip_msgs: int
    gossip_tensors: int  # variables flattened into, and unflattened out of, each message
    gossip_topology: str
    gossip_dynamic: bool
    gossip_awc: bool
    gossip_degree: float  # in-neighbours per step on the strategy's own ranks
    opt_bytes: float  # parameter bytes the busiest rank updates itself
    # parameter tensors the busiest rank's optimizers step (its own variables', and a server's shards)
    opt_tensors: float
    # the same and the sparse PS broadcast under a stateful optimizer (momentum, Adam), whose every row
    # with state changes each step: in a steady state every row of a sparse table
    opt_bytes_state: float
    sps_bcast_state_bytes: float
    n_tensors: int = 0  # trainable tensors: hooks, bucket copies and optimizer dispatch per step
    n_calls: float = 0.0  # collective calls per step (each costs the runtime CPU time)
    sparse_units: int = 0  # sparse variables or shards the sparse path handles (on one rank too)
    # bytes the runtime copies per step: into all-reduce buckets holding several tensors (world > 1),
    # a dense PS gradient divided into a fresh tensor (world > 1), a PS shard written back (any world)
    copy_bytes: float = 0.0
    ps_units: int = 0  # dense variables or shards the PS path handles (on one rank too)
    model_key: str = ""  # the profile's compute.model_key: its measured local steps, if calibrated
    # several hosts (links.py): each host's link in the phases that share it, LinkLoad.arrays (4, hosts)
    link_hosts: tuple[str, ...] = ()
    values_link: np.ndarray = field(default_factory=lambda: np.zeros((4, 0)))  # PS values after the step
    values_link_state: np.ndarray = field(default_factory=lambda: np.zeros((4, 0)))  # ... momentum, Adam
    gather_link: np.ndarray = field(default_factory=lambda: np.zeros((4, 0)))  # sparse PS gathers
    # gossip, per step of its topology's period: most same-host in-neighbours, most flows into and
    # out of one host's link (each one message of gossip_bytes)
    gossip_intra_degree: np.ndarray = field(default_factory=lambda: np.zeros(0))
    gossip_flows_in: np.ndarray = field(default_factory=lambda: np.zeros(0))
    gossip_flows_out: np.ndarray = field(default_factory=lambda: np.zeros(0))


def profile_timing(profile: ModelProfile) -> ProfileTiming:
    """Split the profile's compute into forward/backward and place each gradient on the backward timeline.

    Gradients become ready in ``grad_ready_order``; a variable is ready once the backward of its
    layer (``VariableProfile.layer``, else a layer named like the variable) has run. Without
    per-layer times, backward time is spread by parameter count.
    """
    layers = {layer.name: layer for layer in profile.layers}
    sum_f = sum(layer.time_fwd for layer in profile.layers)
    sum_b = sum(layer.time_bwd for layer in profile.layers)
    total = profile.compute_time
    share_f = sum_f / (sum_f + sum_b) if sum_f + sum_b > 0 else 1 / 3
    fwd, bwd = total * share_f, total * (1 - share_f)

    by_name = {v.name: v for v in profile.variables}
    use_layers = sum_b > 0 and any((v.layer in layers or v.name in layers) for v in profile.variables)
    cum, seen, ready = 0.0, set(), {}
    for name in profile.grad_ready_order:
        v = by_name[name]
        if use_layers:
            key = v.layer if v.layer in layers else (v.name if v.name in layers else None)
            if key is not None and key not in seen:
                seen.add(key)
                cum += layers[key].time_bwd
        else:
            cum += v.numel
        ready[name] = cum
    scale = 1.0 / cum if cum > 0 else 0.0
    return ProfileTiming(
        fwd, bwd, {k: (t * scale if cum > 0 else 1.0) for k, t in ready.items()}, model_key(profile)
    )


def estimate_touched_rows(v: VariableProfile, profile: ModelProfile, per_replica: int) -> int:
    """Rows of an embedding one step's gradient touches: measured, else batch x fields (ids per sample)."""
    rows = v.shape[0] if v.shape else 1
    if v.touched_rows is not None:
        return min(int(v.touched_rows * per_replica / profile.batch_size), rows) or 1
    fields = 1
    spec = profile.input_spec or {}
    if str(spec.get("dtype", "")).startswith("int") and spec.get("shape"):
        fields = max(1, math.prod(int(d) for d in spec["shape"]))
    return max(1, min(rows, per_replica * fields))


def _wire(nbytes: float, v: VariableProfile, sync: Sync) -> float:
    """fp16/bf16 compressors halve a 4-byte gradient on the all-reduce wire (runtime/compress.py)."""
    if sync.compressor in ("fp16", "bf16") and v.nbytes >= 4 * max(v.numel, 1):
        return nbytes / 2
    return nbytes


@dataclass
class _Tally:
    """What one strategy's units add up to, before they become arrays (see ``_tally``)."""

    # backward tasks, one per all-reduce bucket or PS reduce: [ready, first position, ar bytes,
    # ar calls, red bytes, red calls, raw bytes, bucket cap, units in it, holds a shard]
    tasks: list[list[float]] = field(default_factory=list)
    ag_bytes: float = 0.0
    sps_gather: float = 0.0
    sps_bcast: float = 0.0
    gossip_bytes: float = 0.0
    local_opt: float = 0.0
    ps_copy: float = 0.0
    gossip_msgs: int = 0
    gossip_tensors: int = 0
    sparse_units: int = 0
    ps_units: int = 0
    local_vars: set[str] = field(default_factory=set)  # variables the rank's own optimizer steps
    server_units: dict[int, int] = field(default_factory=dict)  # tensors each server's optimizer steps
    gather_dtypes: set[str] = field(default_factory=set)  # sparse all-gather: one packed exchange per dtype
    # sparse PS: one packed gather and broadcast per (server, dtype)
    sparse_servers: set[tuple[int, str]] = field(default_factory=set)
    # server -> [bytes, msgs, raw bytes, raw bytes under a stateful optimizer]
    ps_load: dict[int, list[float]] = field(default_factory=dict)
    # a stateful optimizer (momentum, Adam) on a sparse variable: every row with state changes each step
    local_opt_state: float = 0.0  # beyond local_opt
    sps_bcast_state: float = 0.0
    sparse_values_state: dict[int, float] = field(default_factory=dict)
    # per-host traffic (links.py): each dense PS broadcast (server, bytes), and per server the sparse
    # rows every rank gathers to it and the changed rows it broadcasts
    ps_values: list[tuple[int, float]] = field(default_factory=list)
    sparse_gather: dict[int, float] = field(default_factory=dict)
    sparse_values: dict[int, float] = field(default_factory=dict)


def _units(profile: ModelProfile, strategy: Strategy) -> list[tuple[VariableProfile, Sync, float]]:
    """(variable, sync, fraction of the variable) in reverse parameter order (the order backward
    makes gradients ready): a partitioned variable gives one unit per shard."""
    by_name = {v.name: v for v in profile.variables}
    position = {v.name: i for i, v in enumerate(profile.variables)}  # model.parameters() order
    plans = sorted((pl for pl in strategy.variables if pl.name in by_name), key=lambda pl: -position[pl.name])
    units = []
    for plan in plans:
        v = by_name[plan.name]
        syncs = plan.syncs
        if plan.partition is not None and v.shape and plan.partition.axis < len(v.shape):
            dim = v.shape[plan.partition.axis]
            fracs = [n / max(dim, 1) for n in plan.partition.sizes(dim)]
        else:
            fracs = [1.0] * len(syncs)
        units.extend((v, s, f) for s, f in zip(syncs, fracs))
    return units


def _tally(
    units: list[tuple[VariableProfile, Sync, float]],
    profile: ModelProfile,
    strategy: Strategy,
    timing: ProfileTiming,
    bucket_bytes: int,
    ddp: bool,
) -> _Tally:
    """Each unit charged where the runtime sends it: all-reduce buckets (filled in backward order
    up to the cap), PS reduces and server loads, sparse all-gathers and gathers, gossip.

    Long because each sync kind's charge sits beside the others, as the runtime dispatches them; the
    branches share the open buckets and the servers' loads."""
    p = max(strategy.world, 1)
    per_replica = strategy.batch.per_replica
    position = {v.name: i for i, v in enumerate(profile.variables)}  # model.parameters() order
    tasks: list[list[float]] = []
    open_bucket: dict[tuple, list[float]] = {}
    ag_bytes = sps_gather = sps_bcast = gossip_bytes = local_opt = 0.0
    gossip_msgs = gossip_tensors = sparse_units = ps_units = 0
    ps_copy = 0.0
    local_vars: set[str] = set()  # variables the rank's own optimizer steps (one tensor each)
    server_units: dict[int, int] = {}  # server -> tensors (variables or shards) its optimizer steps
    gather_dtypes: set[str] = set()  # sparse all-gather: one packed exchange per value dtype
    sparse_servers: set[tuple[int, str]] = set()  # sparse PS: one packed gather and broadcast per server
    ps_load: dict[int, list[float]] = {}  # server -> [bytes, msgs, raw bytes, raw bytes with state]
    local_opt_state = sps_bcast_state = 0.0
    sparse_values_state: dict[int, float] = {}
    ps_values: list[tuple[int, float]] = []
    sparse_gather: dict[int, float] = {}
    sparse_values: dict[int, float] = {}
    for v, sync, frac in units:
        raw = v.nbytes * frac
        ready = timing.ready.get(v.name, 1.0)
        sparse = v.sparse
        if sync.kind == "allreduce" or (sync.kind == "allgather" and not sparse):
            key = ("ddp",) if ddp else (sync.group or 0, sync.compressor, v.dtype)
            cap = DDP_FIRST_BUCKET_BYTES if ddp and not tasks and key not in open_bucket else bucket_bytes
            b = open_bucket.get(key)
            if b is not None and b[6] + raw > b[7]:
                b = None
            if b is None:
                b = [0.0, position[v.name], 0.0, 1.0, 0.0, 0.0, 0.0, cap, 0.0, 0.0]
                open_bucket[key] = b
                tasks.append(b)
            b[0] = max(b[0], ready)
            b[1] = min(b[1], position[v.name])
            b[2] += _wire(raw, v, sync)
            b[6] += raw
            b[8] += 1.0  # units in the bucket
            b[9] = b[9] or float(frac < 1.0)  # a shard is copied out of its variable even alone
            local_opt += raw
            local_vars.add(v.name)
        elif sync.kind == "ps":
            s = ps_load.setdefault(int(sync.server or 0), [0.0, 0.0, 0.0, 0.0])
            server_units[int(sync.server or 0)] = server_units.get(int(sync.server or 0), 0) + 1
            if sparse:  # gather rows to the server after backward; broadcast changed rows after its step
                sparse_units += 1
                rows = estimate_touched_rows(v, profile, per_replica) * frac
                sps_gather += rows * (v.row_bytes + INDEX_BYTES)
                server = int(sync.server or 0)
                sparse_servers.add((server, v.dtype))
                union = min(rows * p, (v.shape[0] if v.shape else 1) * frac)
                s[2] += union * v.row_bytes  # a sparse gradient updates only the rows it holds
                sps_bcast += union * (v.row_bytes + INDEX_BYTES)
                sparse_gather[server] = sparse_gather.get(server, 0.0) + rows * (v.row_bytes + INDEX_BYTES)
                sparse_values[server] = sparse_values.get(server, 0.0) + union * (v.row_bytes + INDEX_BYTES)
                # under momentum or Adam every row with state changes (runtime/ps.py _changed_rows): in
                # a steady state, every row of the table
                table = (v.shape[0] if v.shape else 1) * frac
                s[3] += table * v.row_bytes
                sps_bcast_state += table * (v.row_bytes + INDEX_BYTES)
                sparse_values_state[server] = sparse_values_state.get(server, 0.0) + table * (
                    v.row_bytes + INDEX_BYTES
                )
            else:
                s[2] += raw
                s[3] += raw
                tasks.append([ready, position[v.name], 0.0, 0.0, raw, 1.0, raw, 0.0, 1.0, 0.0])
                s[0] += raw
                s[1] += 1
                ps_units += 1
                ps_values.append((int(sync.server or 0), raw))
                # runtime/ps.py: every rank divides its gradient into a fresh tensor for the reduce
                # (world > 1) and writes each shard's new value back into its variable (any world)
                ps_copy += raw * ((p > 1) + (frac < 1.0))
        elif sync.kind == "allgather":  # sparse: indices + values of the touched rows
            sparse_units += 1
            rows = estimate_touched_rows(v, profile, per_replica) * frac
            ag_bytes += rows * (v.row_bytes + INDEX_BYTES)
            gather_dtypes.add(v.dtype)
            held = min(rows * p, (v.shape[0] if v.shape else 1) * frac) * v.row_bytes  # rows it holds
            local_opt += held
            local_vars.add(v.name)
            local_opt_state += raw - held  # momentum or Adam: the rows with state, in a steady state all
        elif sync.kind == "gossip":
            gossip_bytes += raw
            gossip_tensors += 1
            gossip_msgs = 1  # the runtime flattens every gossip variable into one message per neighbour
            local_opt += raw
            local_vars.add(v.name)
    return _Tally(
        tasks=tasks,
        ag_bytes=ag_bytes,
        sps_gather=sps_gather,
        sps_bcast=sps_bcast,
        gossip_bytes=gossip_bytes,
        local_opt=local_opt,
        gossip_msgs=gossip_msgs,
        gossip_tensors=gossip_tensors,
        sparse_units=sparse_units,
        ps_units=ps_units,
        ps_copy=ps_copy,
        local_vars=local_vars,
        server_units=server_units,
        gather_dtypes=gather_dtypes,
        sparse_servers=sparse_servers,
        ps_load=ps_load,
        local_opt_state=local_opt_state,
        sps_bcast_state=sps_bcast_state,
        sparse_values_state=sparse_values_state,
        ps_values=ps_values,
        sparse_gather=sparse_gather,
        sparse_values=sparse_values,
    )


def compile_strategy(
    profile: ModelProfile,
    strategy: Strategy,
    timing: ProfileTiming | None = None,
    bucket_bytes: int = BUCKET_BYTES,
    ddp: bool = True,
) -> CompiledStrategy:
    """Turn one strategy into backward tasks, sparse exchanges, server loads and gossip figures.

    Long because it fills CompiledStrategy's fields, one per line; the work is in ``_units`` and
    ``_tally``."""
    timing = timing or profile_timing(profile)
    p = max(strategy.world, 1)
    per_replica = strategy.batch.per_replica
    ddp = ddp and ddp_applies(strategy)  # the runtime's own rule (strategy/execution.py)
    tally = _tally(_units(profile, strategy), profile, strategy, timing, bucket_bytes, ddp)
    # runtime order: by the earliest parameter a task holds, last first
    tally.tasks.sort(key=lambda task: -task[1])
    # runtime/sparse.py: the counts of every unit in one all-gather, then indices and values packed
    ag_calls = 3 * len(tally.gather_dtypes) if tally.gather_dtypes else 0
    sps_gather_calls = 1 + 2 * len(tally.sparse_servers) if tally.sparse_servers else 0
    sps_bcast_calls = 3 * len(tally.sparse_servers)  # per server: counts, rows, values
    if p == 1:  # one rank calls no collective at all (its gradients are the global ones)
        ag_calls = sps_gather_calls = sps_bcast_calls = 0

    servers = sorted(s for s in tally.ps_load if tally.ps_load[s][0] > 0)
    ps_bytes = np.array([tally.ps_load[s][0] for s in servers], dtype=float)
    total_ps = float(ps_bytes.sum())
    own = [tally.ps_load[r][0] if r in tally.ps_load else 0.0 for r in range(p)]
    hosts: dict[str, int] = {}
    devices: dict[tuple[str, str], int] = {}
    for r in strategy.ranks:
        hosts[r.host] = hosts.get(r.host, 0) + 1
        if not r.device.startswith("cpu"):
            devices[(r.host, r.device)] = devices.get((r.host, r.device), 0) + 1
    g = strategy.gossip

    def col(i: int) -> np.ndarray:
        return np.array([t[i] for t in tally.tasks], dtype=float)

    def suffix(i: int) -> np.ndarray:
        return np.cumsum(col(i)[::-1])[::-1]

    # task k ends the timeline no later than an earlier task j with ready_j >= ready_k
    # (end_last = max_k ready_k + suffix_k, and suffixes only grow towards the front)
    ready = col(0)
    keep = ready > np.concatenate([[-np.inf], np.maximum.accumulate(ready)[:-1]]) if len(ready) else ready > 0
    fwd_bwd = timing.fwd + timing.bwd
    scale = profile.compute_time_at(per_replica) / fwd_bwd if fwd_bwd > 0 else 0.0  # fwd : bwd kept
    degree = strategy_in_degree(strategy) if tally.gossip_msgs else 0.0
    return CompiledStrategy(
        name=strategy.name,
        builder=strategy.builder,
        world=p,
        per_replica=per_replica,
        accum=max(strategy.batch.accumulation, 1),
        fwd=timing.fwd * scale,
        bwd=timing.bwd * scale,
        hosts=tuple(sorted(hosts.items())),
        device_share=max(devices.values(), default=1),
        gpu=bool(devices),
        profile_threads=int(profile.meta["threads"]) if profile.meta.get("threads") else None,
        profile_thread_efficiency=profile.thread_efficiency,
        multi_host=len(hosts) > 1,
        ddp=ddp,
        task_ar_bytes=col(2),
        task_red_bytes=col(4),
        task_ready=col(0)[keep],
        suf_ar_calls=suffix(3)[keep],
        suf_ar_bytes=suffix(2)[keep],
        suf_red_calls=suffix(5)[keep],
        suf_red_bytes=suffix(4)[keep],
        ag_bytes=tally.ag_bytes,
        ag_calls=ag_calls,
        sps_gather_bytes=tally.sps_gather,
        sps_gather_calls=sps_gather_calls,
        ps_bytes=ps_bytes,
        ps_msgs=np.array([tally.ps_load[s][1] for s in servers], dtype=float),
        ps_worker_bytes=total_ps - min(own) if total_ps else 0.0,
        sps_bcast_bytes=tally.sps_bcast,
        sps_bcast_calls=sps_bcast_calls,
        gossip_bytes=tally.gossip_bytes,
        gossip_msgs=tally.gossip_msgs,
        gossip_tensors=tally.gossip_tensors,
        gossip_topology=g.topology if g else "exp2",
        gossip_dynamic=bool(g and g.dynamic),
        gossip_awc=bool(g and g.mode == "awc"),
        gossip_degree=degree,
        opt_bytes=tally.local_opt + max((v[2] for v in tally.ps_load.values()), default=0.0),
        opt_tensors=float(len(tally.local_vars) + max(tally.server_units.values(), default=0)),
        opt_bytes_state=tally.local_opt
        + tally.local_opt_state
        + max((v[3] for v in tally.ps_load.values()), default=0.0),
        sps_bcast_state_bytes=tally.sps_bcast_state,
        n_tensors=len(profile.variables),
        model_key=timing.model_key,
        sparse_units=tally.sparse_units,
        # the PS path's copies (above), and runtime/allreduce.py's: every bucket is divided by the
        # world in place (a pass over its bytes, as the PS path's division), and a bucket of several
        # tensors (or a shard) is first flattened by torch.cat, one of a whole variable reduced in
        # place (one rank launches no bucket at all; DDP's gradients are bucket views, divided by its hook)
        copy_bytes=tally.ps_copy
        + (
            sum(t[6] * (2.0 if t[8] > 1 or t[9] else 1.0) for t in tally.tasks if t[2] > 0)
            if p > 1 and not ddp
            else 0.0
        ),
        ps_units=tally.ps_units,
        **links.link_fields(  # type: ignore[arg-type]
            strategy,
            [*tally.ps_values, *tally.sparse_values.items()],
            [*tally.ps_values, *tally.sparse_values_state.items()],
            list(tally.sparse_gather.items()),
            bool(tally.gossip_msgs),
        ),
        n_calls=float(
            len(tally.tasks) * (p > 1)
            + ag_calls
            + sps_gather_calls
            + sps_bcast_calls
            + sum(tally.ps_load[s][1] for s in servers) * (p > 1)
            + tally.gossip_msgs * math.ceil(degree)
        ),
    )
