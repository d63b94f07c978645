"""CostParams: the calibrated numbers of the cost model (alpha-beta per collective and link, contention,
optimizer)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any

from distlab.costmodel.collectives import COLLECTIVES, LINK_CLASSES
from distlab.errors import CalibrationError
from distlab.resources import ResourceSpec
from distlab.strategy.execution import BUCKET_BYTES

PARAMS_VERSION = 1
# terms added after files were first saved: a file without them is read with 0 (CostParams.from_dict)
_LATER_TERMS = ("copy_per_byte", "sgd_tensor", "momentum_tensor", "adam_tensor", "overlap_loss")
# optimizer names -> what their update costs like (the state tensors it keeps); None: the launch's
# default optimizer (Adam at 1e-3, distlab.conventions)
OPTIMIZER_KINDS = {
    None: "adam",
    "sgd": "sgd",
    "momentum": "momentum",
    "rmsprop": "momentum",
    "adagrad": "momentum",
    "adam": "adam",
    "adamw": "adam",
}


def optimizer_kind(optimizer: str | None) -> str:
    """``"sgd"``, ``"momentum"`` or ``"adam"`` for a kind or an optimizer name (one error otherwise)."""
    key = optimizer.lower() if isinstance(optimizer, str) else optimizer
    if key not in OPTIMIZER_KINDS:
        raise CalibrationError(
            f"optimizer: {optimizer!r} is not one the cost model prices; use one of "
            f"{', '.join(k for k in OPTIMIZER_KINDS if k)} (distlab.conventions.optimizer_kind maps "
            "a factory)"
        )
    return OPTIMIZER_KINDS[key]


@dataclass(frozen=True)
class CostParams:
    """Numbers the simulator needs besides the profile and the strategy, one per field below.

    ``Lab.calibrate`` fits them (docs/cost-model.md says which stage fits which); an uncalibrated
    model has these defaults and the ``ResourceSpec``'s link figures. Times are seconds, sizes bytes.
    """

    alpha_beta: dict[str, tuple[float, float]] = field(default_factory=dict)
    """``"collective/link"`` (e.g. ``"allreduce/intra"``) -> ``(alpha s, beta s/byte)``; a missing
    entry falls back to the ``ResourceSpec``'s link figures."""
    contention: float = 0.05
    """Extra compute slowdown per additional busy core on a host (memory bandwidth, caches; contention.py)."""
    thread_efficiency: float = 0.8
    """How compute scales with the threads a rank gets (contention.py)."""
    optimizer_per_byte: float = 3e-10
    """Seconds per parameter byte of one plain-SGD update, the bytes out of cache as in a step."""
    momentum_work: float = 2.0
    """An update with one state tensor (SGD with momentum, RMSprop, Adagrad) per byte, relative to
    plain SGD (calibration times it; 2: the textbook passes over memory)."""
    adam_work: float = 4.0
    """An Adam-family update (two state tensors) per byte, relative to plain SGD."""
    sgd_tensor: float = 0.0
    """Seconds per parameter tensor of one plain-SGD update beside its bytes (a step of Python and
    a kernel launch per tensor): the runtime's own SGD, timed by calibration over many small tensors
    (0 until calibrated, as the loop's other per-tensor costs)."""
    momentum_tensor: float = 0.0
    """``sgd_tensor`` for an update with one state tensor (the launch's momentum SGD)."""
    adam_tensor: float = 0.0
    """``sgd_tensor`` for an Adam-family update (the launch's default Adam: Keras's update rule, eight
    in-place operations and a step counter per tensor)."""
    copy_per_byte: float = 1.5e-10
    """Seconds per byte of the runtime's copies: gradients flattened into one all-reduce message,
    the PS path's divided gradients and shard write-backs, gossip's passes over its bytes (those,
    on bytes the step has just written, unslowed by contention)."""
    compute_scale: float = 1.0
    """Multiplies the profiled compute (a profile taken on another machine or thread count)."""
    step_overhead: float = 0.0
    """The training loop's own cost per step (reading the batch, zeroing gradients, Python)."""
    lockstep_overhead: float = 0.0
    """Per step when several ranks step together: a local step on the cluster waits for its
    slowest peer each step (what a rank's compute measured in lockstep carries beyond its
    arithmetic; the training-loop stage fits what a strategy adds to it)."""
    rank_overhead: float = 0.0
    """Per step per rank beyond the first: ranks waiting for the slowest one beyond what the
    lockstep local steps already wait."""
    tensor_overhead: float = 0.0
    """The training loop's cost per step per trainable tensor."""
    runtime_overhead: float = 0.0
    """The strategy's machinery per step (autograd hooks, bucket copies, per-tensor dispatch)."""
    hook_overhead: float = 0.0
    """The strategy's machinery per step per trainable tensor."""
    oversubscription: float = 0.0
    """Extra compute slowdown per unit of ranks beyond a host's cores (contention.py)."""
    call_overhead: float = 0.0
    """The runtime's own work around each collective call (packing, dispatch; counted in ``comm``;
    one rank makes no calls)."""
    peer_call_overhead: float = 0.0
    """Per collective call per peer, times the host's time-slicing: a collective waits for every
    peer to be scheduled and to reach it, which lockstep microbenchmarks do not see."""
    gather_peer_overhead: float = 0.0
    """``peer_call_overhead`` for the calls that gather sparse rows (the all-gather path's and the
    PS path's gathers to its servers: row packing and coalescing between them)."""
    gossip_per_byte: float = 0.0
    """Per gossiped byte per in-neighbour beyond the wire and the copies (exchanges of tens of MB
    that leave the caches)."""
    gossip_tensor_overhead: float = 0.0
    """Per gossiped tensor per in-neighbour: the per-tensor dispatch of an exchange."""
    sparse_unit_overhead: float = 0.0
    """Per step per sparse variable or shard at any world size, one rank included (coalescing its
    rows, packing, unpacking, building the sparse gradient, finding the rows a server changed)."""
    ps_unit_overhead: float = 0.0
    """Per step per dense variable or shard on the PS path: its reduce, its server's broadcast
    and its write-back are each a step of Python."""
    comm_scale: float = 1.0
    """Multiplies the byte (beta) terms of every wire time the microbenchmarks predict within a host:
    inside a step bytes move slower than in a lockstep microbenchmark (peers arrive at different
    times, copies compete with compute for a CPU host's cores). Fitted to training loops on the
    first host's ranks; a strategy across hosts moves its bytes at the link's own measured rate."""
    alpha_scale: float = 1.0
    """Multiplies the latency (alpha) terms of the same: calls issued back to back overlap part of
    their latencies, which a microbenchmark timing each call after a barrier does not."""
    comm_oversubscription: float = 0.0
    """Added to both scales per unit of ranks beyond a host's cores."""
    incast: float = 0.0
    """How much slower per byte one host's link carries ``k`` concurrent flows into it than one flow
    alone, per flow beyond the first: ``k`` flows of ``n`` bytes take ``k n beta (1 + incast (k - 1))``
    (beta: ``send/inter``, the link's one-way rate). Calibration measures 2 and 3 senders on other hosts
    into one rank (links.py prices every phase that shares a host's link with it)."""
    overlap_loss: float = 0.0
    """The share of the communication hidden behind backward that the step pays all the same: on a
    CPU host gloo's reductions and copies run on the cores backward computes on, so an all-reduce
    bucket overlapping backward slows it (0 on a GPU, whose collectives have their own engines).
    Fitted by the training-loop stage to a reference whose buckets overlap a long backward."""
    outcast: float = 0.0
    """``incast`` for ``k`` concurrent flows out of one host's link (one rank sending to several)."""
    bucket_bytes: int = BUCKET_BYTES
    """The all-reduce bucket cap the runtime uses (``RunOptions.bucket_bytes``)."""
    ddp: bool = False
    """Price pure all-reduce strategies as torch's DDP reducer buckets them (``RunOptions.ddp``),
    ignoring the strategy's group ids; False prices distlab's own buckets."""

    def __post_init__(self) -> None:
        for key, ab in self.alpha_beta.items():
            coll, _, link = key.partition("/")
            if coll not in COLLECTIVES or link not in LINK_CLASSES:
                raise CalibrationError(
                    f"alpha_beta[{key!r}]: expected 'collective/link' with collective in {COLLECTIVES} and "
                    f"link in {LINK_CLASSES}"
                )
            if len(ab) != 2 or ab[0] < 0 or ab[1] < 0:
                raise CalibrationError(f"alpha_beta[{key!r}]: expected (alpha >= 0, beta >= 0), got {ab!r}")
        negative = [f.name for f in fields(self) if f.type == "float" and getattr(self, f.name) < 0]
        if negative or min(self.compute_scale, self.comm_scale, self.alpha_scale) <= 0:
            raise CalibrationError(
                f"CostParams: {', '.join(negative) or 'compute_scale, comm_scale and alpha_scale'} must be "
                ">= 0 (compute_scale, comm_scale and alpha_scale > 0); write params with CostModel.save() "
                "or Lab.calibrate()"
            )

    def alpha_beta_for(
        self, collective: str, link: str, resources: ResourceSpec | None
    ) -> tuple[float, float]:
        """(alpha, beta) of one collective over one link class, calibrated or from the resource spec."""
        ab = self.alpha_beta.get(f"{collective}/{link}")
        if ab is not None:
            return float(ab[0]), float(ab[1])
        if resources is not None and link in resources.links:
            lk = resources.links[link]
        else:
            from distlab.resources import DEFAULT_INTER, DEFAULT_INTRA

            lat, bw = DEFAULT_INTRA if link == "intra" else DEFAULT_INTER
            return lat, 1.0 / bw
        return float(lk.latency), 1.0 / float(lk.bandwidth)

    def optimizer_work(self, optimizer: str | None) -> float:
        """How much more an update of ``optimizer`` costs per byte than plain SGD's: a kind
        (``"sgd"``, ``"momentum"``, ``"adam"``) or an optimizer name; None is the launch default,
        Adam (``distlab.conventions``)."""
        kind = optimizer_kind(optimizer)
        return {"sgd": 1.0, "momentum": self.momentum_work, "adam": self.adam_work}[kind]

    def optimizer_tensor(self, optimizer: str | None) -> float:
        """Seconds per parameter tensor of an update of ``optimizer`` beside its bytes (as
        ``optimizer_work`` takes it)."""
        kind = optimizer_kind(optimizer)
        return {"sgd": self.sgd_tensor, "momentum": self.momentum_tensor, "adam": self.adam_tensor}[kind]

    def with_(self, **changes: Any) -> CostParams:
        return replace(self, **changes)

    # -- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": PARAMS_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "alpha_beta":
                value = {k: [float(a), float(b)] for k, (a, b) in sorted(value.items())}
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CostParams:
        """Fields missing from ``d`` (a file from an older distlab) keep their defaults, except
        the terms that file's model did not have (``copy_per_byte``, the optimizers' per-tensor
        costs, ``overlap_loss``): 0, so it predicts as it did."""
        try:
            kwargs: dict[str, Any] = {
                "alpha_beta": {
                    k: (float(v[0]), float(v[1])) for k, v in dict(d.get("alpha_beta") or {}).items()
                }
            }
            # a file from before these terms: its model charged none of them
            kwargs.update(dict.fromkeys(_LATER_TERMS, 0.0))
            for f in fields(cls):
                if f.name != "alpha_beta" and f.name in d:
                    kwargs[f.name] = {"float": float, "int": int, "bool": bool}[str(f.type)](d[f.name])
            return cls(**kwargs)
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise CalibrationError(
                f"cost model JSON: malformed params ({exc}); write it with CostModel.save()"
            ) from None


def fingerprint_of(resources: ResourceSpec | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a calibration was taken on: hosts, ranks, devices, cores and library versions, plus a short
    hash."""
    from importlib import metadata

    fp: dict[str, Any] = {}
    if resources is not None:
        fp["hosts"] = list(resources.hosts)
        fp["ranks"] = [[r.host, r.device] for r in resources.ranks]
        fp["cores"] = dict(sorted(resources.cores.items()))
    versions = {}
    for lib in ("torch", "numpy"):
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    fp["versions"] = versions
    fp.update(extra or {})
    fp["hash"] = hashlib.sha256(json.dumps(fp, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return fp
