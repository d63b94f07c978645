"""The vectorised simulator: many compiled strategies x many environments in a handful of numpy ops.

Step time (DESIGN.md, Cost model), with each transfer where the runtime performs it (compile.py):
``accum * (fwd + bwd) * slowdown`` + exposed backward tasks + sparse exchanges + optimizer
+ broadcasts from servers + gossip.

- Backward tasks (all-reduce buckets, PS reduces) run one after another as gradients become
  ready: task k starts when its gradients are ready and task k-1 has finished,
  ``end_k = max(ready_k, end_{k-1}) + T_k``, which unrolls to
  ``end_last = max_k (ready_k + sum_{j>=k} T_j)``: a suffix sum, no Python loop. Only
  ``end_last - backward`` is exposed, and only the last micro-batch's backward hides anything.
- Servers broadcast after their optimizer step; the busiest server, or the rank with the most
  bytes to receive from other servers, bounds that phase.
- Gossip (BlueFog) runs after the step (ATC) or alongside the optimizer step (AWC), so AWC only
  exposes what outlasts the step.
Collective costs are alpha-beta with Thakur et al. (2005) factors (collectives.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab.costmodel.collectives import COLLECTIVES, factors
from distlab.costmodel.compile import CompiledStrategy
from distlab.costmodel.links import round_share, shared_time
from distlab.costmodel.params import CostParams

_SCALARS = (
    "world",
    "per_replica",
    "accum",
    "fwd",
    "bwd",
    "multi_host",
    "ag_bytes",
    "ag_calls",
    "sps_gather_bytes",
    "sps_gather_calls",
    "ps_worker_bytes",
    "sps_bcast_bytes",
    "sps_bcast_calls",
    "gossip_bytes",
    "gossip_msgs",
    "gossip_tensors",
    "gossip_awc",
    "opt_bytes",
    "opt_bytes_state",
    "opt_tensors",
    "sps_bcast_state_bytes",
    "n_tensors",
    "n_calls",
    "sparse_units",
    "copy_bytes",
    "ps_units",
)
_TASKS = ("task_ready", "suf_ar_calls", "suf_ar_bytes", "suf_red_calls", "suf_red_bytes")
_SERVERS = ("ps_bytes", "ps_msgs")
_ROUNDS = ("gossip_intra_degree", "gossip_flows_in", "gossip_flows_out")


def _link_bytes(items: Sequence[CompiledStrategy], name: str) -> np.ndarray:
    """Per strategy, ``(4, hosts)`` as LinkLoad.arrays: the bytes into and out of each host's link in one
    phase and the flows carrying them, padded with empty hosts (links.py)."""
    width = max((getattr(c, name).shape[1] for c in items), default=0)
    out = np.zeros((len(items), 4, width))
    for i, c in enumerate(items):
        a = getattr(c, name)
        out[i, :, : a.shape[1]] = a
    return out


def _pad(items: Sequence[CompiledStrategy], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Ragged per-strategy arrays as zero-padded (S, max length) arrays, by one fancy assignment each."""
    lengths = np.fromiter((len(getattr(c, names[0])) for c in items), dtype=np.intp, count=len(items))
    width = int(lengths.max()) if len(items) else 0
    rows = np.repeat(np.arange(len(items)), lengths)
    cols = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out = {}
    for name in names:
        a = np.zeros((len(items), width))
        if width:
            a[rows, cols] = np.concatenate([getattr(c, name) for c in items])
        out[name] = a
    return out


class Batch:
    """Compiled strategies stacked into arrays: ``(S,)`` per scalar, ``(S, tasks)`` and ``(S, servers)``
    padded with 0."""

    def __init__(self, items: Sequence[CompiledStrategy]) -> None:
        self.items = list(items)
        n = len(self.items)
        for name in _SCALARS:
            setattr(self, name, np.fromiter((getattr(c, name) for c in self.items), dtype=float, count=n))
        for name, a in {
            **_pad(self.items, _TASKS),
            **_pad(self.items, _SERVERS),
            **_pad(self.items, _ROUNDS),
        }.items():
            setattr(self, name, a)
        self.gossip_period = np.fromiter((len(c.gossip_intra_degree) for c in self.items), float, count=n)
        self.values_link = _link_bytes(self.items, "values_link")
        self.values_link_state = _link_bytes(self.items, "values_link_state")
        self.gather_link = _link_bytes(self.items, "gather_link")
        self.env_cache: dict = {}  # per-resources arrays the model derives once (slowdown, links)

    @classmethod
    def stack(cls, items: Sequence[CompiledStrategy]) -> Batch:
        return cls(items)

    def __getattr__(self, name: str) -> np.ndarray:
        """The arrays set in ``__init__`` (one per compiled field) are all ndarrays: says so to a type
        checker."""
        raise AttributeError(name)


@dataclass
class Env:
    """Per-evaluation conditions, each broadcastable to (S, E).

    ``alpha``/``beta`` map a collective to arrays already chosen for each strategy's link class;
    the scalar figures (optimizer cost, loop and call overheads, compute scale) come from ``params``.
    """

    world: np.ndarray
    alpha: dict[str, np.ndarray]
    beta: dict[str, np.ndarray]
    slowdown: np.ndarray
    gossip_degree: np.ndarray
    ps_worker_bytes: np.ndarray | None = None  # override when the world differs from the strategy's
    sliced: np.ndarray | float = 1.0  # ranks taking turns per core (contention.time_slicing)
    # the optimizer's slowdown when the model's own is measured (None: ``slowdown`` serves both)
    optimizer_slowdown: np.ndarray | None = None
    params: CostParams = field(default_factory=CostParams)  # optimizer, overhead and scale figures
    optimizer_work: float = (
        1.0  # the run's optimizer per byte relative to plain SGD (CostParams.optimizer_work)
    )
    optimizer_tensor: float = 0.0  # the run's optimizer per parameter tensor (CostParams.optimizer_tensor)
    # an exchange within a host (sendrecv/intra: alpha, beta): gossip's inner steps on several hosts
    intra_exchange: tuple[float, float] = (0.0, 0.0)
    # the run's optimizer keeps state (momentum, Adam): a sparse variable's every row with state changes
    # each step (its update and its PS broadcast: in a steady state the whole table)
    stateful: bool = False


def _link_time(load: np.ndarray, prm: CostParams) -> np.ndarray:
    """(S,) bytes-equivalent of the busiest direction of the busiest host's link (links.shared_time)."""
    if not load.shape[-1]:
        return np.zeros(load.shape[0])
    return shared_time(load, 1.0, prm.incast, prm.outcast)[0]


def _gossip_wire(
    b: Batch, env: Env, al: dict[str, np.ndarray], be: dict[str, np.ndarray], inner_ab: tuple[Any, Any]
) -> np.ndarray:
    """Gossip's exchanges per step: ``degree (alpha + bytes beta)``; on several hosts, per step of the
    topology's period, the slower of the exchanges within a host and the busiest host link's flows
    (one message each, shared: links.py), averaged over the period."""
    prm = env.params
    deg = np.asarray(env.gossip_degree, dtype=float)
    nbytes = b.gossip_bytes[:, None]
    wire = deg * (al["sendrecv"] * b.gossip_msgs[:, None] + be["sendrecv"] * nbytes)
    hosts = b.gossip_period > 0
    if not hosts.any():
        return wire
    fin, fout = b.gossip_flows_in, b.gossip_flows_out
    shared = round_share(fin, fout, prm.incast, prm.outcast)[:, None, :]
    link = np.where(
        shared > 0, al["sendrecv"][..., None] + be["sendrecv"][..., None] * nbytes[..., None] * shared, 0.0
    )
    ia, ib = (np.asarray(x)[..., None] for x in inner_ab)
    inner = b.gossip_intra_degree[:, None, :] * (ia + ib * nbytes[..., None])
    per_step = np.maximum(link, inner).sum(axis=-1) / np.maximum(b.gossip_period, 1.0)[:, None]
    # the rounds are the strategy's own ranks': a what-if at another world keeps the degree's formula
    own = hosts[:, None] & (b.gossip_msgs[:, None] > 0) & (np.asarray(env.world) == b.world[:, None])
    return np.where(own, per_step, wire)


def evaluate(b: Batch, env: Env) -> dict[str, np.ndarray]:
    """Step time and its parts for every (strategy, environment): arrays of shape (S, E).

    Long because it is one vectorised formula read top to bottom (compute, each communication path, the
    optimizer, the step), over a dozen arrays that pieces would have to pass between them."""
    prm = env.params

    def col(x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=float)[:, None]  # (S,) -> (S, 1)

    p = np.broadcast_to(
        np.asarray(env.world, dtype=float), np.broadcast_shapes(np.shape(env.world), (len(b.items), 1))
    )
    # a collective in a training step: the microbenchmarks' latency and byte terms, each scaled
    # (both more when ranks take turns on the cores)
    sliced = np.asarray(env.sliced, dtype=float)
    turns = prm.comm_oversubscription * (sliced - 1.0)
    intra_a, intra_b = prm.alpha_scale + turns, prm.comm_scale + turns
    # the scales are fitted to training loops within one host (calibration's third stage runs on the
    # first host's ranks): bytes between hosts move at the link's own measured rate, never faster
    wire_a, wire_b = intra_a, intra_b
    if b.multi_host.any():
        inter = col(b.multi_host) > 0
        wire_a, wire_b = np.where(inter, 1.0 + turns, intra_a), np.where(inter, 1.0 + turns, intra_b)
    al = env.alpha if np.all(wire_a == 1.0) else {c: a * wire_a for c, a in env.alpha.items()}
    be = env.beta if np.all(wire_b == 1.0) else {c: b * wire_b for c, b in env.beta.items()}
    slow = np.asarray(env.slowdown, dtype=float)
    fwd = col(b.fwd) * slow * prm.compute_scale
    bwd = col(b.bwd) * slow * prm.compute_scale
    overhead = (
        prm.step_overhead
        + prm.lockstep_overhead * (p > 1)
        + prm.runtime_overhead
        + prm.rank_overhead * (p - 1)
        + (prm.tensor_overhead + prm.hook_overhead) * col(b.n_tensors)
    )
    compute = col(b.accum) * (fwd + bwd) + overhead

    # backward tasks: end_last = max_k (ready_k * bwd + T_k + ... + T_last), suffix sums precompiled (S, E, T)
    if b.task_ready.shape[1]:
        aa, ab = factors("allreduce", p)
        ra, rb = factors("reduce", p)
        end = b.task_ready[:, None, :] * bwd[..., None]
        for calls, nbytes, (fa, fb), c in (
            (b.suf_ar_calls, b.suf_ar_bytes, (aa, ab), "allreduce"),
            (b.suf_red_calls, b.suf_red_bytes, (ra, rb), "reduce"),
        ):
            end = (
                end
                + (fa * al[c])[..., None] * calls[:, None, :]
                + (fb * be[c])[..., None] * nbytes[:, None, :]
            )
        backward_total = end[..., 0] - b.task_ready[:, None, 0] * bwd
        backward = np.maximum(end.max(axis=-1) - bwd, 0.0)
        # what hid behind backward still costs overlap_loss of itself: on a CPU host the reductions
        # and copies of a bucket in flight take the cores backward computes on
        hidden = np.maximum(backward_total - backward, 0.0)
        backward = backward + prm.overlap_loss * hidden
    else:
        backward = backward_total = hidden = np.zeros_like(p)

    # after backward: sparse all-gathers and sparse gathers to servers ((p-1) messages each)
    ga, gb = factors("allgather", p)
    sparse = ga * al["allgather"] * col(b.ag_calls + b.sps_gather_calls) + gb * be["allgather"] * col(
        b.ag_bytes + b.sps_gather_bytes
    )

    opt_slow = slow if env.optimizer_slowdown is None else np.asarray(env.optimizer_slowdown, dtype=float)
    optimizer = (
        col(b.opt_bytes_state if env.stateful else b.opt_bytes)
        * prm.optimizer_per_byte
        * env.optimizer_work
        * opt_slow
    )
    # and per tensor: a step of Python and a few kernel launches each, slowed only by taking turns
    optimizer = optimizer + col(b.opt_tensors) * env.optimizer_tensor * sliced

    # after the step: servers broadcast new values; the busiest server or busiest receiver bounds
    ba, bb = factors("broadcast", p)
    many = p > 1
    sps_bcast = b.sps_bcast_state_bytes if env.stateful else b.sps_bcast_bytes
    broadcast = ba * al["broadcast"] * col(b.sps_bcast_calls) + bb * be["broadcast"] * col(sps_bcast)
    if b.ps_bytes.shape[1]:
        server = (ba * al["broadcast"])[..., None] * b.ps_msgs[:, None, :] + (bb * be["broadcast"])[
            ..., None
        ] * b.ps_bytes[:, None, :]
        push = env.ps_worker_bytes if env.ps_worker_bytes is not None else col(b.ps_worker_bytes)
        broadcast = broadcast + np.maximum(server.max(axis=-1), be["broadcast"] * push * many)
    # several hosts: every server's values in flight at once share each host's link (links.py)
    if b.values_link.shape[-1]:  # one host: no link between hosts, nothing to add
        own = np.asarray(env.world) == col(b.world)  # the traffic is the strategy's own ranks'
        values = col(_link_time(b.values_link_state if env.stateful else b.values_link, prm)) * own
        broadcast = np.where(
            values > 0, np.maximum(broadcast, ba * al["send"] + be["send"] * values), broadcast
        )
        gathered = col(_link_time(b.gather_link, prm)) * own
        sparse = np.where(gathered > 0, np.maximum(sparse, al["send"] + be["send"] * gathered), sparse)

    deg = np.asarray(env.gossip_degree, dtype=float)
    inner_ab = (env.intra_exchange[0] * intra_a, env.intra_exchange[1] * intra_b)
    gossip = _gossip_wire(b, env, al, be, inner_ab) + deg * (
        prm.gossip_per_byte * col(b.gossip_bytes) + prm.gossip_tensor_overhead * col(b.gossip_tensors)
    )
    awc = col(b.gossip_awc) > 0
    gossip = np.where(awc, np.maximum(gossip - optimizer, 0.0), gossip)
    # runtime/gossip.py's own passes over the gossiped bytes, in copies: flatten, weigh, write back
    # (ATC: 3) or also re-flatten and apply the local update (AWC: 6), plus an add per in-neighbour
    # (1.5: two reads, one write); none of it hides behind the exchange. Not slowed as the
    # optimizer is: these bytes were just written by the step (or received), so in cache
    # (evidence: datasets/measurements/README.md, "Figures behind the code")
    passes = np.where(col(b.gossip_bytes) > 0, np.where(awc, 6.0, 3.0) + 1.5 * deg, 0.0)
    gossip = gossip + passes * col(b.gossip_bytes) * prm.copy_per_byte

    # the runtime's own work around each collective call, and waiting for every peer to reach it
    waits = (p - 1) * sliced
    # the sparse paths' gathers of rows: the all-gather path's (sizes, then indices and values) and
    # the PS path's to its servers (counts, then per server indices and values), each packing and
    # coalescing rows between calls (evidence: datasets/measurements/README.md, "Figures behind the code")
    gathers = col(b.ag_calls + b.sps_gather_calls)
    calls = col(b.n_calls) * (prm.call_overhead + prm.peer_call_overhead * waits)
    calls = (
        calls + gathers * prm.gather_peer_overhead * waits + col(b.sparse_units) * prm.sparse_unit_overhead
    )
    calls = calls + col(b.ps_units) * prm.ps_unit_overhead
    calls = (
        calls + col(b.copy_bytes) * prm.copy_per_byte * opt_slow
    )  # flattens and copies, as busy as the optimizer
    comm = backward + sparse + broadcast + gossip + calls
    step = compute + comm + optimizer
    samples = col(b.per_replica) * col(b.accum) * p
    return {
        "step_time": step,
        "throughput": samples / step,
        "compute": compute,
        "comm": comm,
        "optimizer": optimizer,
        "backward": backward,
        "backward_total": backward_total,
        "hidden": hidden + np.zeros_like(step),
        "sparse": sparse,
        "broadcast": broadcast,
        "gossip": gossip,
        "calls": calls + np.zeros_like(step),
        "world": p + np.zeros_like(step),
    }


def link_arrays(
    multi_host: np.ndarray, table: dict[str, dict[str, tuple[float, float]]]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Choose intra or inter (alpha, beta) per strategy: ``table[link][collective] -> (alpha, beta)``."""
    inter = np.asarray(multi_host, dtype=bool)[:, None]
    alpha = {c: np.where(inter, table["inter"][c][0], table["intra"][c][0]) for c in COLLECTIVES}
    beta = {c: np.where(inter, table["inter"][c][1], table["intra"][c][1]) for c in COLLECTIVES}
    return alpha, beta
