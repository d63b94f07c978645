"""CostParams: the calibrated numbers of the cost model (alpha-beta per collective and link, contention, optimizer)."""

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


@dataclass(frozen=True)
class CostParams:
    """Numbers the simulator needs besides the profile and the strategy.

    ``alpha_beta`` maps ``"collective/link"`` (e.g. ``"allreduce/intra"``) to ``(alpha s, beta s/byte)``;
    a missing entry falls back to the ``ResourceSpec``'s link figures, so an uncalibrated model
    follows whatever the resource spec says. ``contention``: extra slowdown per additional busy
    core on a host (memory bandwidth, caches); ``thread_efficiency``: how compute scales with the
    threads a rank gets (contention.py).
    ``optimizer_per_byte``: seconds per parameter byte of one optimizer update;
    ``copy_per_byte``: seconds per byte of the runtime's copies (flattening several gradients
    into one all-reduce message, the PS path's divided gradients and shard write-backs, gossip's
    passes over its bytes), both measured with the bytes out of cache as in a step (gossip's
    passes, on bytes the step has just written, are charged at it unslowed by contention).
    ``compute_scale`` multiplies the profiled compute (profile taken on another machine or thread
    count). What a training step costs beyond compute, communication and the optimizer's
    arithmetic, measured by ``Lab.calibrate``: the loop itself (reading the batch, zeroing
    gradients, Python; the local-step stage) costs ``step_overhead`` seconds per step and
    ``tensor_overhead`` seconds per step per trainable tensor; the strategy's machinery (autograd
    hooks, bucket copies, per-tensor dispatch; the training-loop stage) ``runtime_overhead``
    seconds per step, ``hook_overhead`` seconds per step per trainable tensor and
    ``rank_overhead`` seconds per step per rank beyond the first (ranks waiting for the slowest
    one beyond what the lockstep local steps already wait); ``call_overhead`` seconds of
    the runtime's own work around each collective call (packing, dispatch; counted in ``comm``;
    one rank makes no calls), and ``peer_call_overhead`` seconds
    per call per peer, times the host's time-slicing (a collective waits for every peer to be
    scheduled and to reach it, which microbenchmarks run in lockstep do not see);
    ``gather_peer_overhead`` the same for the calls that gather sparse rows (the all-gather path's
    and the PS path's gathers to its servers: row packing and coalescing between them), and ``sparse_unit_overhead`` seconds per step per sparse variable or shard at
    any world size, one rank included (coalescing its rows, packing, unpacking, building the
    sparse gradient, finding the rows a server's step changed), ``ps_unit_overhead`` the same per
    dense variable or shard on the PS path (its reduce, its server's broadcast and its write-back
    are each a step of Python per unit; evidence: docs/cost-model.md §History and evidence);
    ``comm_scale`` multiplies the byte (beta) terms
    of every wire time the microbenchmarks predict and ``alpha_scale`` their latency (alpha)
    terms, and ``comm_oversubscription`` adds to both per unit of ranks beyond a host's cores
    (inside a training step bytes move slower than in a lockstep microbenchmark: peers arrive at
    different times, and on a CPU host copies and reductions compete with the ranks' compute for
    the same cores; while calls issued back to back, asynchronously, overlap part of their
    latencies, which a microbenchmark timing each call after a barrier does not); ``gossip_per_byte`` seconds
    per gossiped byte per in-neighbour beyond the wire and copies (exchanges of tens of MB that leave
    the caches; fitted by ``Lab.calibrate``'s training-loop stage) and ``gossip_tensor_overhead`` seconds per gossiped
    tensor per in-neighbour (the per-tensor dispatch of the same). ``oversubscription``: extra
    compute slowdown per unit of ranks beyond a host's cores (contention.py). ``bucket_bytes`` the
    all-reduce bucket cap the runtime uses (``RankJob.extra['bucket_bytes']``); ``ddp``: whether
    the runtime takes its DDP fast path for pure all-reduce strategies (``RankJob.extra['ddp']``),
    whose buckets ignore the strategy's group ids.
    """

    alpha_beta: dict[str, tuple[float, float]] = field(default_factory=dict)
    contention: float = 0.05
    thread_efficiency: float = 0.8
    optimizer_per_byte: float = 3e-10
    copy_per_byte: float = 1.5e-10
    compute_scale: float = 1.0
    step_overhead: float = 0.0
    rank_overhead: float = 0.0
    tensor_overhead: float = 0.0
    runtime_overhead: float = 0.0
    hook_overhead: float = 0.0
    oversubscription: float = 0.0
    call_overhead: float = 0.0
    peer_call_overhead: float = 0.0
    gather_peer_overhead: float = 0.0
    gossip_per_byte: float = 0.0
    gossip_tensor_overhead: float = 0.0
    sparse_unit_overhead: float = 0.0
    ps_unit_overhead: float = 0.0
    comm_scale: float = 1.0
    alpha_scale: float = 1.0
    comm_oversubscription: float = 0.0
    bucket_bytes: int = BUCKET_BYTES  # all-reduce bucket cap, as the runtime's default
    ddp: bool = False  # Lab.launch runs distlab's own buckets (RankJob.extra['ddp'] is off)

    def __post_init__(self) -> None:
        for key, ab in self.alpha_beta.items():
            coll, _, link = key.partition("/")
            if coll not in COLLECTIVES or link not in LINK_CLASSES:
                raise CalibrationError(
                    f"alpha_beta[{key!r}]: expected 'collective/link' with collective in {COLLECTIVES} and link in {LINK_CLASSES}"
                )
            if len(ab) != 2 or ab[0] < 0 or ab[1] < 0:
                raise CalibrationError(f"alpha_beta[{key!r}]: expected (alpha >= 0, beta >= 0), got {ab!r}")
        negative = [f.name for f in fields(self) if f.type == "float" and getattr(self, f.name) < 0]
        if negative or min(self.compute_scale, self.comm_scale, self.alpha_scale) <= 0:
            raise CalibrationError(
                f"CostParams: {', '.join(negative) or 'compute_scale, comm_scale and alpha_scale'} must be >= 0 "
                "(compute_scale, comm_scale and alpha_scale > 0); "
                "write params with CostModel.save() or Lab.calibrate()"
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
        ``copy_per_byte`` (0: that file's model had no such term, and predicts as it did)."""
        try:
            kwargs: dict[str, Any] = {
                "alpha_beta": {
                    k: (float(v[0]), float(v[1])) for k, v in dict(d.get("alpha_beta") or {}).items()
                }
            }
            kwargs["copy_per_byte"] = 0.0  # a file from before the term: its model charged no copies
            for f in fields(cls):
                if f.name != "alpha_beta" and f.name in d:
                    kwargs[f.name] = {"float": float, "int": int, "bool": bool}[str(f.type)](d[f.name])
            return cls(**kwargs)
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise CalibrationError(
                f"cost model JSON: malformed params ({exc}); write it with CostModel.save()"
            ) from None


def fingerprint_of(resources: ResourceSpec | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a calibration was taken on: hosts, ranks, devices, cores and library versions, plus a short hash."""
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
