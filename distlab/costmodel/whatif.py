"""What-if sweeps: every strategy at many world sizes and bandwidths in one vectorised evaluation (the
picker's sliders)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distlab.costmodel.collectives import COLLECTIVES
from distlab.costmodel.contention import time_slicing
from distlab.costmodel.degree import gossip_in_degree
from distlab.costmodel.evaluate import Batch, Env, evaluate
from distlab.costmodel.params import optimizer_kind
from distlab.errors import check_positive
from distlab.profiling.model_profile import ModelProfile
from distlab.resources import ResourceSpec
from distlab.strategy.types import Strategy

if TYPE_CHECKING:
    from distlab.costmodel.model import CostModel


def sweep_frame(
    cm: CostModel,
    profile: ModelProfile,
    resources: ResourceSpec,
    strategies: Sequence[Strategy],
    worlds: Sequence[int],
    bandwidths: Sequence[float | None] = (None,),
    optimizer: str | None = None,
) -> Any:  # pandas.DataFrame
    """One row per (strategy, world, bandwidth): strategy, index, world, bandwidth, throughput, step_time,
    parts. ``optimizer`` as ``CostModel.predict`` prices it (None: the launch default, Adam).

    Each strategy keeps its plan (buckets, server loads, gossip topology) and is re-costed on
    ``world`` ranks. Hosts keep the ranks per host of ``resources``, so a world that needs more
    hosts pays the inter-host link. A bandwidth (bytes/s, None: as calibrated) scales every
    collective's beta on the link in use in proportion to its point-to-point figure.
    """
    import pandas as pd

    items = [cm.compile(profile, s) for s in strategies]
    batch = Batch.stack(items)
    worlds_e = [int(w) for w in worlds for _ in bandwidths]
    bws = [bw for _ in worlds for bw in bandwidths]
    n_s, n_e = len(items), len(worlds_e)
    rph = max(1, math.ceil(resources.world / max(resources.num_hosts, 1)))
    cores = resources.cores.get(resources.hosts[0]) if resources.hosts else None
    table, links = cm.link_table(resources), cm.links(resources)
    alpha = {c: np.empty((1, n_e)) for c in COLLECTIVES}
    beta = {c: np.empty((1, n_e)) for c in COLLECTIVES}
    slow, opt_slow = np.empty((n_s, n_e)), np.empty((n_s, n_e))
    sliced = np.empty((1, n_e))
    for e, (w, bw) in enumerate(zip(worlds_e, bws)):
        link = "inter" if math.ceil(w / rph) > 1 else "intra"
        scale = 1.0 if bw is None else links[link].bandwidth / float(bw)
        for c in COLLECTIVES:
            alpha[c][0, e], beta[c][0, e] = table[link][c][0], table[link][c][1] * scale
        slows = np.array([cm.slowdowns(c, [(min(w, rph), cores)]) for c in items])
        slow[:, e], opt_slow[:, e] = slows[:, 0], slows[:, 1]
        sliced[0, e] = time_slicing(min(w, rph), cores)
    deg = np.zeros((n_s, n_e))
    for i, c in enumerate(items):
        if c.gossip_msgs:
            deg[i] = [
                c.gossip_degree if w == c.world else gossip_in_degree(c.gossip_topology, w, c.gossip_dynamic)
                for w in worlds_e
            ]
    p = np.asarray(worlds_e, dtype=float)[None, :]
    # ranks beyond the strategy's own hold no server share: they receive every broadcast byte
    push = np.where(
        p > batch.world[:, None], batch.ps_bytes.sum(axis=1)[:, None], batch.ps_worker_bytes[:, None]
    )
    env = Env(
        p,
        alpha,
        beta,
        slow,
        deg,
        ps_worker_bytes=push,
        sliced=sliced,
        optimizer_slowdown=opt_slow,
        params=cm.params,
        optimizer_work=cm.params.optimizer_work(optimizer),
        optimizer_tensor=cm.params.optimizer_tensor(optimizer),
        stateful=optimizer_kind(optimizer) != "sgd",
        intra_exchange=table["intra"]["sendrecv"],
    )
    out = evaluate(batch, env)
    return pd.DataFrame(
        {
            "strategy": np.repeat([c.name for c in items], n_e),
            "index": np.repeat(np.arange(n_s), n_e),
            "world": np.tile(worlds_e, n_s),
            "bandwidth": np.tile(np.array([np.nan if b is None else float(b) for b in bws]), n_s),
            **{k: out[k].ravel() for k in ("throughput", "step_time", "compute", "comm", "optimizer")},
        }
    )


# the inter-host networks a what-if offers: (one-way latency s, bandwidth bytes/s) of one link,
# textbook figures for one flow (an MPI/NCCL-class stack, not a microbenchmark of this cluster)
NETWORKS: dict[str, tuple[float, float] | None] = {
    "as calibrated": None,  # the cost model's own figures (the resource spec's before a calibration)
    "10 Gb/s Ethernet": (50e-6, 10e9 / 8),
    "25 Gb/s Ethernet": (25e-6, 25e9 / 8),
    "100 Gb/s Ethernet": (10e-6, 100e9 / 8),
    "InfiniBand HDR (200 Gb/s)": (2e-6, 200e9 / 8),
}


def hosts_like(resources: ResourceSpec, hosts: int, per_host: int) -> ResourceSpec:
    """``hosts`` hosts like the first of ``resources`` (its cores, its device kind), ``per_host``
    ranks each: "what if I had N machines like this one". The cluster itself when it is that."""
    from distlab.errors import ResourceError

    for name, v in (("hosts", hosts), ("per_host", per_host)):
        check_positive(f"what-if: {name}", v, ResourceError)
    per = [len(resources.ranks_on(h)) for h in resources.hosts]
    if hosts == len(per) and all(n == per_host for n in per):
        return resources
    return resources.with_world(hosts * per_host, per_host=per_host)


def with_network(
    cm: CostModel, resources: ResourceSpec, latency: float, bandwidth: float
) -> tuple[CostModel, ResourceSpec]:
    """``cm`` and ``resources`` with the inter-host link replaced: every collective between hosts
    costs ``latency`` per message and ``1 / bandwidth`` per byte (alpha-beta of one link)."""
    from distlab.errors import ResourceError
    from distlab.resources import Link

    if not (latency > 0 and bandwidth > 0 and math.isfinite(latency) and math.isfinite(bandwidth)):
        raise ResourceError(
            "what-if network: latency and bandwidth must be positive, "
            f"got {latency!r} s and {bandwidth!r} bytes/s"
        )
    ab = {k: v for k, v in cm.params.alpha_beta.items() if not k.endswith("/inter")}
    ab.update({f"{c}/inter": (float(latency), 1.0 / float(bandwidth)) for c in COLLECTIVES})
    return cm.with_params(cm.params.with_(alpha_beta=ab)), resources.with_links(
        inter=Link(latency, bandwidth)
    )
