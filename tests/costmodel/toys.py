"""Small hand-checkable profiles, resources and strategies for the cost-model tests."""

from __future__ import annotations

from distlab.costmodel import CostModel, CostParams
from distlab.costmodel.collectives import COLLECTIVES, LINK_CLASSES
from distlab.profiling.model_profile import LayerProfile, ModelProfile, VariableProfile
from distlab.resources import ResourceSpec
from distlab.strategy.types import BatchConfig, GossipConfig, RankSpec, Strategy, Sync, VariablePlan

ALPHA, BETA = 1e-4, 1e-8  # 100 us, 100 MB/s: round numbers for hand computation


def toy_profile(
    sizes=(1000, 1000, 2000), bwd=(0.010, 0.010, 0.010), fwd=0.005, batch=32, **extra
) -> ModelProfile:
    """Variables v0, v1, ... of ``sizes`` float32 elements, each its own layer; gradients ready
    last-to-first."""
    names = [f"v{i}" for i in range(len(sizes))]
    variables = tuple(VariableProfile(n, (s,), "float32", 4 * s, layer=n) for n, s in zip(names, sizes))
    layers = tuple(
        LayerProfile(n, "Linear", s, time_fwd=fwd, time_bwd=b) for n, s, b in zip(names, sizes, bwd)
    )
    return ModelProfile(variables, layers, batch_size=batch, name="toy", **extra)


def toy_resources(world: int, hosts: int = 1, cores: int | None = None) -> ResourceSpec:
    per = -(-world // hosts)
    ranks = tuple(RankSpec(r, f"h{r // per}") for r in range(world))
    c = {f"h{h}": cores for h in range(hosts)} if cores else {}
    return ResourceSpec(ranks, cores=c)


def exact_model(alpha: float = ALPHA, beta: float = BETA, **kw) -> CostModel:
    """Every collective on every link costs (alpha, beta); no contention, optimizer, bucket copies or DDP
    bucketing unless asked; every optimizer kind costs ``optimizer_per_byte`` (``adam_work`` and
    ``momentum_work`` 1 unless asked)."""
    ab = {f"{c}/{lk}": (alpha, beta) for c in COLLECTIVES for lk in LINK_CLASSES}
    return CostModel(
        CostParams(
            alpha_beta=ab,
            contention=kw.pop("contention", 0.0),
            optimizer_per_byte=kw.pop("optimizer_per_byte", 0.0),
            copy_per_byte=kw.pop("copy_per_byte", 0.0),
            ddp=kw.pop("ddp", False),
            adam_work=kw.pop("adam_work", 1.0),
            momentum_work=kw.pop("momentum_work", 1.0),
            **kw,
        )
    )


def plan(
    profile: ModelProfile,
    syncs,
    resources: ResourceSpec,
    per_replica: int | None = None,
    accum: int = 1,
    gossip: GossipConfig | None = None,
    builder: str = "toy",
) -> Strategy:
    """A strategy with ``syncs[i]`` for variable i (a Sync or a list of per-shard Syncs is not needed
    here)."""
    vs = tuple(VariablePlan(v.name, s) for v, s in zip(profile.variables, syncs))
    return Strategy(
        vs,
        resources.ranks,
        batch=BatchConfig(per_replica or profile.batch_size, accum),
        gossip=gossip,
        builder=builder,
    )


def allreduce(*groups: int, compressor: str = "none") -> list[Sync]:
    return [Sync("allreduce", group=g, compressor=compressor) for g in groups]
