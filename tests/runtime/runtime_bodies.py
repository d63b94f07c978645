"""Importable multi-process test bodies for the runtime (run by spawn_local in fresh processes)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from distlab.adaptive.quadratic import Quadratic, noisy_quadratic, quadratic_loss
from distlab.profiling.model_profile import ModelProfile
from distlab.runtime.data import RankBatches
from distlab.runtime.job import RankJob, RunOptions
from distlab.runtime.sparse import sparse_param_ids
from distlab.strategy.types import GossipConfig, Partition, RankSpec, Strategy, Sync, VariablePlan

BATCH = 4  # per replica


# -- models and data ------------------------------------------------------------------------------
def dense_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 5))


class SparseNet(torch.nn.Module):
    """An embedding with sparse gradients followed by a dense head."""

    def __init__(self, rows: int = 40, dim: int = 6, sparse: bool = True) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(rows, dim, sparse=sparse)
        self.head = torch.nn.Linear(2 * dim, 3)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(idx).reshape(idx.shape[0], -1))


def sparse_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return SparseNet()


def dataset(kind: str, n: int = 96, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    if kind == "sparse":
        return TensorDataset(
            torch.randint(0, 40, (n, 2), generator=g), torch.randint(0, 3, (n,), generator=g)
        )
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, 5, (n,), generator=g))


MODELS = {"dense": dense_model, "sparse": sparse_model}


def sgd_momentum(params: list) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params: list) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.01)


def optimizer_factory(name: str):
    return {"sgd": sgd_momentum, "adam": adam}[name]


def profile_of(model: torch.nn.Module) -> ModelProfile:
    ids = sparse_param_ids(model)
    return ModelProfile.from_variables(
        [(n, tuple(p.shape), "float32", id(p) in ids) for n, p in model.named_parameters()], batch_size=BATCH
    )


# -- strategies -----------------------------------------------------------------------------------
def ranks(world: int) -> tuple[RankSpec, ...]:
    return tuple(RankSpec(r, "127.0.0.1", f"cpu:{r}") for r in range(world))


def _option(text: str) -> Any:
    """A builder option from a case name: a number or True/False as such, else the text."""
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def strategy_for(case: str, model: torch.nn.Module, world: int) -> Strategy:
    """A builder's strategy (``builder:NAME[:opt=value]``) or a hand-built one."""
    import distlab as dl
    from distlab.resources import ResourceSpec

    if case.startswith("builder:"):
        _, name, *opts = case.split(":")
        options = {k: _option(v) for k, v in (o.split("=") for o in opts)}
        return dl.strategy.build(name, profile_of(model), ResourceSpec.local(world), **options)
    names = [n for n, _ in model.named_parameters()]
    shapes = {n: p.shape for n, p in model.named_parameters()}
    sparse = {n for n, p in model.named_parameters() if id(p) in sparse_param_ids(model)}
    plans = []
    for i, n in enumerate(names):
        if case == "mixed":  # every kernel at once, servers spread, partitions on both axes
            if n in sparse:
                plans.append(VariablePlan(n, Sync("allgather")))
            elif len(shapes[n]) == 2 and i % 2 == 0:
                k = min(3, shapes[n][1])
                plans.append(
                    VariablePlan(
                        n,
                        partition=Partition(1, k),
                        shards=tuple(Sync("ps", server=(j + 1) % world) for j in range(k)),
                    )
                )
            elif len(shapes[n]) == 2:
                plans.append(
                    VariablePlan(
                        n,
                        partition=Partition(0, 2),
                        shards=(Sync("allreduce", group=1), Sync("ps", server=world - 1)),
                    )
                )
            else:
                plans.append(VariablePlan(n, Sync("allreduce", group=i % 2)))
        elif case == "allgather":
            plans.append(VariablePlan(n, Sync("allgather" if n in sparse else "allreduce", group=0)))
        elif case == "sparse_ps_partitioned":
            if n in sparse:
                plans.append(
                    VariablePlan(
                        n,
                        partition=Partition(0, 3),
                        shards=tuple(Sync("ps", server=j % world) for j in range(3)),
                    )
                )
            else:
                plans.append(VariablePlan(n, Sync("ps", server=(i + 1) % world)))
        elif case == "allreduce_own":  # the distlab kernel, not DDP
            plans.append(VariablePlan(n, Sync("allreduce", group=i % 2)))
        elif case == "fp16":
            plans.append(VariablePlan(n, Sync("allreduce", group=0, compressor="fp16")))
        elif case.startswith("gossip"):
            plans.append(VariablePlan(n, Sync("gossip")))
        else:
            raise ValueError(case)
    gossip = None
    if case.startswith("gossip"):
        _, topo, mode = case.split(":")
        gossip = GossipConfig(
            topology=topo,
            dynamic=topo == "one_peer_exp2",
            mode=mode,
            asynchronous=mode in ("push_sum", "average"),
        )
    return Strategy(tuple(plans), ranks(world), batch=_batch(), gossip=gossip, builder=case)


def _batch():
    from distlab.strategy.types import BatchConfig

    return BatchConfig(per_replica=BATCH)


# -- bodies ----------------------------------------------------------------------------------------
def job_for(rank: int, world: int, addr: str, port: int, model: Any, strategy: Any, **kw: Any) -> RankJob:
    """A RankJob for one rank of a test group: dense toy data and the test batch unless given."""
    kw.setdefault("data", dataset("dense"))
    kw.setdefault("batch_size", BATCH)
    return RankJob(
        rank=rank, world=world, master_addr=addr, master_port=port, strategy=strategy, model=model, **kw
    )


def make_job(
    rank: int, world: int, addr: str, port: int, case: str, model_kind: str, opt: str, steps: int, **kw: Any
) -> RankJob:
    model = MODELS[model_kind]()
    run_id = f"{case}-{model_kind}-{opt}-{kw.pop('tag', '')}"
    case, flags = case_flags(case)
    options = RunOptions(ddp="ddp" in flags)
    if "per_table" in flags:  # the sparse kernels one table at a time (the benchmark's baseline)
        options = RunOptions(sparse_exchange="per_table")
    strategy = strategy_for(case, model, world)
    if flags.get("acc", 1) > 1 or flags.get("lr", "none") != "none":
        batch = dataclasses.replace(
            strategy.batch, accumulation=flags.get("acc", 1), lr_scaling=flags.get("lr", "none")
        )
        strategy = dataclasses.replace(strategy, batch=batch)
    return RankJob(
        rank=rank,
        world=world,
        master_addr=addr,
        master_port=port,
        strategy=strategy,
        model=model,
        steps=steps,
        data=dataset(model_kind),
        optimizer=optimizer_factory(opt),
        batch_size=BATCH,
        shuffle=True,
        seed=3,
        run_id=run_id,
        timeout=30.0,
        options=options,
        **kw,
    )


def case_flags(case: str) -> tuple[str, dict[str, Any]]:
    """``builder:AllReduce+ddp+acc3+linear`` -> the case and its flags: ``ddp``, ``per_table``,
    ``acc`` (micro-batches per step), ``lr`` (the learning-rate scaling rule)."""
    base, *parts = case.split("+")
    flags: dict[str, Any] = {}
    for part in parts:
        if part.startswith("acc"):
            flags["acc"] = int(part[3:])
        elif part in ("linear", "sqrt", "adascale"):
            flags["lr"] = part
        else:
            flags[part] = True
    return base, flags


def lr_gain(case: str, world: int) -> float:
    """The gain the case's scaling rule gives a global batch of ``BATCH * acc * world`` (base: BATCH)."""
    _, flags = case_flags(case)
    scale = flags.get("acc", 1) * world
    return {"none": 1.0, "linear": float(scale), "sqrt": scale**0.5}[flags.get("lr", "none")]


EQUIVALENCE_STEPS = 4
# test_runtime_equivalence.py's cases: every non-gossip strategy against one process
EQUIVALENCE_CASES = [
    ("builder:AllReduce", "dense", "sgd"),  # distlab's bucketed kernel
    ("builder:AllReduce", "dense", "adam"),
    ("builder:AllReduce+ddp", "dense", "adam"),  # torch's DDP reducer (extra ddp=True)
    ("allreduce_own", "dense", "sgd"),  # two groups
    ("fp16", "dense", "sgd"),  # fp16 on the wire: close, not exact (checked with its own tolerance)
    ("builder:PS:servers=all", "dense", "sgd"),
    ("builder:PS:servers=all", "dense", "adam"),
    ("builder:PSLoadBalancing:servers=all", "dense", "adam"),
    ("builder:PartitionedPS:servers=all", "dense", "sgd"),
    ("builder:UnevenPartitionedPS:servers=all", "dense", "adam"),
    ("builder:PartitionedAR", "dense", "sgd"),
    ("builder:PartitionedAR", "dense", "adam"),
    ("builder:RandomAxisPartitionAR", "dense", "adam"),
    ("builder:Parallax", "dense", "adam"),
    ("mixed", "dense", "adam"),  # all kernels at once, PS shards on several servers
    ("mixed", "dense", "sgd"),
    # sparse embedding gradients (SGD: torch's Adam refuses sparse gradients, single-process too)
    ("builder:AllReduce", "sparse", "sgd"),
    ("builder:PS:servers=all", "sparse", "sgd"),
    ("builder:PartitionedPS:servers=all", "sparse", "sgd"),
    ("builder:Parallax", "sparse", "sgd"),
    ("allgather", "sparse", "sgd"),
    ("sparse_ps_partitioned", "sparse", "sgd"),
    ("mixed", "sparse", "sgd"),
    ("builder:PartitionedPS:servers=all+per_table", "sparse", "sgd"),  # one exchange per table
    ("mixed+per_table", "sparse", "sgd"),
]
# test_accumulation.py's cases: gradient accumulation and learning-rate scaling
ACCUMULATION_CASES = [
    ("builder:AllReduce+acc3", "dense", "sgd"),  # distlab's buckets
    ("builder:AllReduce+acc3", "dense", "adam"),
    ("builder:AllReduce+ddp+acc3", "dense", "adam"),  # torch's DDP reducer under no_sync
    ("builder:PS:servers=all+acc3", "dense", "adam"),
    ("builder:PartitionedPS:servers=all+acc2", "dense", "sgd"),
    ("mixed+acc2", "dense", "adam"),  # every kernel at once
    ("builder:AllReduce+acc3", "sparse", "sgd"),
    ("builder:PS:servers=all+acc2", "sparse", "sgd"),
    ("builder:Parallax+acc3", "sparse", "sgd"),
    ("mixed+acc2", "sparse", "sgd"),
    ("builder:AllReduce+acc2+linear", "dense", "sgd"),  # the rate times the global batch / BATCH
    ("builder:AllReduce+ddp+acc2+sqrt", "dense", "adam"),
    ("builder:PS:servers=all+linear", "dense", "sgd"),
]


def equivalence_body(
    rank: int, world: int, addr: str, port: int, cases: list[tuple[str, str, str]], steps: int
) -> dict:
    """Run every (case, model, optimizer) in this one process group; return each rank's final weights."""
    from distlab.runtime.trainer import run_rank

    out = {}
    for case, model_kind, opt in cases:
        job = make_job(rank, world, addr, port, case, model_kind, opt, steps)
        res = run_rank(job)
        out[(case, model_kind, opt)] = {
            "weights": {k: v.detach().clone() for k, v in job.model.state_dict().items()},
            "steps": res["steps"],
            "losses": [r["loss"] for r in res["records"]],
        }
    return out


def reference_weights(
    model_kind: str, opt: str, steps: int, world: int, accumulation: int = 1, gain: float = 1.0
) -> dict[str, torch.Tensor]:
    """One process training on the whole global batch (mean loss), same data order, at ``gain``
    times the optimizer's rate."""
    from distlab.runtime.trainer import default_loss

    model = MODELS[model_kind]()
    optim = optimizer_factory(opt)(list(model.parameters()))
    for g in optim.param_groups:
        g["lr"] *= gain
    G = BATCH * world * accumulation
    data = RankBatches(dataset(model_kind), G, 0, 1, True, 3)
    for t in range(steps):
        x, y = data.get(t * G)
        optim.zero_grad()
        default_loss(model(x), y).backward()
        optim.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- gossip ---------------------------------------------------------------------------------------
def averaging_body(
    rank: int,
    world: int,
    addr: str,
    port: int,
    topo_name: str,
    steps: int,
    mode: str = "atc",
    slowdown: Any = (),
    device: str = "cpu",
    backend: str = "auto",
) -> dict:
    """Pure averaging (lr 0): rank r starts from weights seeded r; returns its weights, the
    distance and its records (``slowdown``: RunOptions.slowdown, {rank: factor})."""
    from distlab.runtime.trainer import run_rank

    model = dense_model(seed=100 + rank)
    strategy = dataclasses.replace(strategy_for(f"gossip:{topo_name}:{mode}", model, world), backend=backend)
    job = job_for(
        rank,
        world,
        addr,
        port,
        model,
        strategy,
        steps=steps,
        data=dataset("dense"),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.0),
        batch_size=BATCH,
        run_id=f"avg-{topo_name}-{mode}",
        timeout=30.0,
        options=RunOptions(slowdown=tuple(dict(slowdown).items())),
        device=device,
    )
    res = run_rank(job)
    return {
        "weights": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
        "on": str(next(model.parameters()).device),
        "distance": res["consensus_distance"],
        "records": res["records"],
    }


def digits_body(rank: int, world: int, addr: str, port: int, cases: list[str], steps: int) -> dict:
    """Train a small classifier on scikit-learn's digits under each case; return rank-averaged losses."""
    from sklearn.datasets import load_digits

    from distlab.runtime.trainer import run_rank

    X, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y))
    out = {}
    for case in cases:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        if case == "allreduce":
            from distlab.strategy.types import BatchConfig

            strategy = Strategy(
                tuple(VariablePlan(n, Sync("allreduce")) for n, _ in model.named_parameters()),
                ranks(world),
                batch=BatchConfig(per_replica=16),
            )
        else:
            strategy = strategy_for(case, model, world)
        job = job_for(
            rank,
            world,
            addr,
            port,
            model,
            strategy,
            steps=steps,
            data=data,
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            batch_size=16,
            run_id=f"digits-{case}",
            timeout=30.0,
        )
        res = run_rank(job)
        out[case] = {
            "losses": np.array([r["loss"] for r in res["records"]]),
            "distance": res["consensus_distance"],
        }
    return out


# -- faults ---------------------------------------------------------------------------------------
class Boom(torch.nn.Module):
    """Raises in forward on one rank at one step."""

    def __init__(self, rank: int, fail_rank: int, fail_step: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)
        self.calls, self.rank, self.fail_rank, self.fail_step = 0, rank, fail_rank, fail_step

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rank == self.fail_rank and self.calls == self.fail_step:
            raise ValueError("injected failure")
        self.calls += 1
        return self.lin(x)


def failing_rank_body(
    rank: int, world: int, addr: str, port: int, fail_rank: int, case: str, tag: str = ""
) -> dict:
    from distlab.runtime.trainer import run_rank

    torch.manual_seed(0)
    model = Boom(rank, fail_rank, fail_step=2)
    strategy = strategy_for(case, model, world)
    job = job_for(
        rank,
        world,
        addr,
        port,
        model,
        strategy,
        steps=5,
        data=dataset("dense"),
        batch_size=BATCH,
        run_id=f"fail-{case}{tag}",
        timeout=20.0,
    )
    return run_rank(job)


def mismatch_body(rank: int, world: int, addr: str, port: int, kind: str) -> dict:
    """A strategy built for another model: every rank must fail before its first step."""
    from distlab.runtime.trainer import run_rank

    model = dense_model()
    strategy = strategy_for("allreduce_own", model, world)
    if kind == "missing":
        strategy = Strategy(strategy.variables[:-1], strategy.ranks, batch=strategy.batch)
    elif kind == "extra":
        strategy = Strategy(
            (*strategy.variables, VariablePlan("ghost.weight", Sync("allreduce"))),
            strategy.ranks,
            batch=strategy.batch,
        )
    elif kind == "shape":
        bad = VariablePlan(
            "2.bias", partition=Partition(0, 9), shards=tuple(Sync("allreduce") for _ in range(9))
        )
        strategy = Strategy((*strategy.variables[:-1], bad), strategy.ranks, batch=strategy.batch)
    steps_seen = []
    job = job_for(
        rank,
        world,
        addr,
        port,
        model,
        strategy,
        steps=3,
        data=dataset("dense"),
        batch_size=BATCH,
        run_id=f"mismatch-{kind}",
        timeout=20.0,
    )
    return run_rank(job, emit=steps_seen.append)


def gossip_suite_body(rank: int, world: int, addr: str, port: int, digits_steps: int) -> dict:
    """Pure averaging on one_peer_exp2 and exp2, then digits training under gossip and all-reduce."""
    return {
        "one_peer_exp2": averaging_body(rank, world, addr, port, "one_peer_exp2", steps=2),
        "exp2": averaging_body(rank, world, addr, port, "exp2", steps=2),
        "digits": digits_body(
            rank,
            world,
            addr,
            port,
            ["allreduce", "gossip:one_peer_exp2:atc", "gossip:one_peer_exp2:awc", "gossip:exp2:atc"],
            digits_steps,
        ),
    }


FAILING_CASES = (
    "builder:AllReduce",
    "mixed",
    "builder:PS:servers=all",
    "builder:PS:servers=all:staleness=1",  # the stale PS's server threads and their groups
    "builder:PSLoadBalancing:servers=all:sync=False",
    "builder:Gossip:asynchronous=True",  # the windows' receiver threads and their group
    "builder:AllReduce",  # after them: a run in the same processes still forms and fails cleanly
)


def failing_key(i: int) -> str:
    """The key of ``FAILING_CASES[i]``'s outcome: by position, since a case may run twice."""
    return f"{i}: {FAILING_CASES[i]}"


def faults_body(rank: int, world: int, addr: str, port: int) -> dict:
    """Mismatched strategies (fail before step 0) and a rank raising mid-run, for several kernels."""
    import time

    out: dict = {}
    for kind in ("missing", "extra", "shape"):
        try:
            mismatch_body(rank, world, addr, port, kind)
            out[kind] = None
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            out[kind] = exc
    # one run that fails nowhere first: a process's first training run pays its one-time setup (6 s here,
    # 10-14 s on a loaded machine), which would otherwise count as the first case's time to stop
    failing_rank_body(rank, world, addr, port, fail_rank=world, case=FAILING_CASES[0], tag="warm")
    for i, case in enumerate(FAILING_CASES):
        t0 = time.monotonic()
        try:
            failing_rank_body(rank, world, addr, port, fail_rank=1, case=case, tag=str(i))
            out[failing_key(i)] = (None, time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001
            out[failing_key(i)] = (exc, time.monotonic() - t0)
    deadline = time.monotonic() + 5.0  # a stale PS's server thread ends with its run's groups
    while time.monotonic() < deadline and _ps_threads():
        time.sleep(0.1)
    out["ps threads"] = _ps_threads()
    return out


def _ps_threads() -> list[str]:
    import threading

    return [
        t.name for t in threading.enumerate() if t.name.startswith(("distlab-ps-server", "distlab-window"))
    ]


def checkpoint_body(
    rank: int,
    world: int,
    addr: str,
    port: int,
    directory: str,
    case: str = "builder:PartitionedPS:servers=all",
) -> dict:
    """Run 4 steps checkpointing every 2; resume a second run from the step-2 checkpoint; both end alike."""
    from distlab.runtime import checkpoint
    from distlab.runtime.trainer import run_rank

    # a run keeps only its newest checkpoint; this test resumes from the one before it
    checkpoint.save.__defaults__ = (3,)

    full = make_job(
        rank,
        world,
        addr,
        port,
        case,
        "dense",
        "adam",
        4,
        checkpoint_dir=directory,
        checkpoint_every=2,
        tag="full",
    )
    res = run_rank(full)
    path = checkpoint.path_for(directory, 2)
    state = checkpoint.load(path)
    resumed = make_job(
        rank,
        world,
        addr,
        port,
        case,
        "dense",
        "adam",
        4,
        start_step=2,
        sample_offset=int(state["samples"]),
        resume_from=str(path),
        tag="resumed",
    )
    res2 = run_rank(resumed)
    return {
        "full": {k: v.clone() for k, v in full.model.state_dict().items()},
        "resumed": {k: v.clone() for k, v in resumed.model.state_dict().items()},
        "checkpoint": res["checkpoint"],
        "resumed_steps": [r["step"] for r in res2["records"]],
        "samples": state["samples"],
    }


def stop_body(rank: int, world: int, addr: str, port: int, case: str = "allreduce_own") -> dict:
    """Rank 1's should_stop turns true before step 3: every rank stops at the same step, cleanly
    (an asynchronous run's ranks at or past the agreed step)."""
    from distlab.runtime.trainer import run_rank

    job = make_job(rank, world, addr, port, case, "dense", "sgd", 50, tag="stop")
    seen: list[int] = []

    def should_stop() -> bool:
        return rank == 1 and len(seen) >= 3

    res = run_rank(job, emit=lambda r: seen.append(r["step"]), should_stop=should_stop)
    return {"steps": res["steps"], "stopped": res["stopped"]}


def nccl_equivalence_body(rank: int, world: int, addr: str, port: int, cases: list, steps: int) -> dict:
    """As ``equivalence_body`` with the model on ``cuda:rank`` (backend auto -> nccl)."""
    from distlab.runtime.trainer import run_rank

    out = {}
    for case, model_kind, opt in cases:
        job = make_job(
            rank, world, addr, port, case, model_kind, opt, steps, device=f"cuda:{rank}", tag="nccl"
        )
        res = run_rank(job)
        out[(case, model_kind, opt)] = {
            "weights": {k: v.detach().cpu() for k, v in job.model.state_dict().items()},
            "steps": res["steps"],
        }
    return out


# -- the gradient noise scale -------------------------------------------------------------------
def noise_body(rank: int, world: int, addr: str, port: int, modes: list[tuple], steps: int) -> dict:
    """For each (per-replica batch, accumulation[, lr scaling rule]): the noise scale measured after
    ``steps`` frozen steps (SGD at rate 0) on the noisy quadratic, and the records' adaptive columns."""
    from distlab.runtime.trainer import run_rank
    from distlab.strategy.types import BatchConfig

    out = {}
    for b, k, *rule in modes:
        w, data = noisy_quadratic()
        model = Quadratic(w)
        st = strategy_for("builder:AllReduce", model, world)
        st = dataclasses.replace(
            st, batch=BatchConfig(per_replica=b, accumulation=k, lr_scaling=(rule or ["none"])[0])
        )
        job = RankJob(
            rank=rank,
            world=world,
            master_addr=addr,
            master_port=port,
            strategy=st,
            model=model,
            steps=steps,
            data=data,
            loss=quadratic_loss,
            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.0),
            batch_size=b,
            seed=1,
            run_id=f"noise-{b}-{k}-{rule}",
            timeout=60.0,
            options=RunOptions(noise_scale=True),
        )
        res = run_rank(job)
        last = res["records"][-1]
        out[(b, k, *rule)] = {
            key: last[key] for key in ("noise_scale", "efficiency", "global_batch", "lr_gain", "progress")
        }
    return out


def adaptive_body(rank: int, world: int, addr: str, port: int, steps: int, n: int) -> list[dict]:
    """An adaptive run on the noisy quadratic (rate 0, phi = 64) with a controller table whose
    goodput optimum is a global batch of about 128; returns this rank's records."""
    from distlab.runtime.trainer import run_rank
    from distlab.strategy.builders.adaptive_batch import Bounds
    from distlab.strategy.types import BatchConfig

    w, data = noisy_quadratic(n=n)
    model = Quadratic(w)
    st = strategy_for("builder:AllReduce", model, world)
    st = dataclasses.replace(st, batch=BatchConfig(per_replica=4, accumulation=1, lr_scaling="adascale"))
    configs = Bounds((4, 64), 2).configurations(world)
    table = [[b, k, 0.05 + 2e-4 * b * k * world] for b, k in configs]
    job = RankJob(
        rank=rank,
        world=world,
        master_addr=addr,
        master_port=port,
        strategy=st,
        model=model,
        steps=steps,
        data=data,
        loss=quadratic_loss,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.0),
        batch_size=4,
        seed=1,
        run_id="adaptive",
        timeout=60.0,
        options=RunOptions(adaptive={"table": table}, base_batch=4),
    )
    return run_rank(job)["records"]


def wrong_checkpoint_body(rank: int, world: int, addr: str, port: int, directory: str) -> str:
    """Resume the sparse model from a checkpoint the dense model wrote: the error's text."""
    from distlab.errors import LaunchError
    from distlab.runtime import checkpoint
    from distlab.runtime.trainer import run_rank

    path = checkpoint.save(
        directory, {"step": 2, "samples": 8, "model": dense_model().state_dict(), "optimizer": {}}
    )
    job = make_job(
        rank, world, addr, port, "builder:AllReduce", "sparse", "sgd", 4, start_step=2, resume_from=str(path)
    )
    try:
        run_rank(job)
    except LaunchError as exc:
        return str(exc)
    return "no error"


# -- CUDA (one GPU is enough: NCCL at one rank, gloo for ranks sharing a device) ------------------
def cuda_body(
    rank: int, world: int, addr: str, port: int, cases: list, steps: int, device: str, backend: str
) -> dict:
    """``equivalence_body`` with the model on ``device`` and the strategy's backend set; weights
    and losses come back on the host."""
    from distlab.runtime.trainer import run_rank

    out = {}
    for case, model_kind, opt in cases:
        job = make_job(rank, world, addr, port, case, model_kind, opt, steps, device=device, tag=backend)
        job = dataclasses.replace(job, strategy=dataclasses.replace(job.strategy, backend=backend))
        res = run_rank(job)
        out[(case, model_kind, opt)] = {
            "weights": {k: v.detach().cpu() for k, v in job.model.state_dict().items()},
            "steps": res["steps"],
            "losses": [r["loss"] for r in res["records"]],
            "on": str(next(job.model.parameters()).device),
        }
    return out


def nccl_probe_body(rank: int, world: int, addr: str, port: int) -> dict:
    """distlab's own process group on NCCL: a real all-reduce, broadcast and all-gather of CUDA tensors."""
    import torch.distributed as dist

    from distlab.runtime.process_group import connect_store, process_group

    store = connect_store(addr, port, world, 30.0, "nccl-probe")
    with process_group(store, rank, world, "nccl", 30.0, f"cuda:{rank}"):
        x = torch.arange(4, dtype=torch.float32, device=f"cuda:{rank}") + rank
        dist.all_reduce(x)
        b = torch.full((3,), float(rank + 7), device=f"cuda:{rank}")
        dist.broadcast(b, src=0)
        got = [torch.zeros(2, device=f"cuda:{rank}") for _ in range(world)]
        dist.all_gather(got, torch.full((2,), float(rank), device=f"cuda:{rank}"))
        torch.cuda.synchronize()
        backend = dist.get_backend()
    return {
        "backend": backend,
        "all_reduce": x.cpu().tolist(),
        "broadcast": b.cpu().tolist(),
        "all_gather": [g.cpu().tolist() for g in got],
    }


# -- stale-synchronous and asynchronous PS ----------------------------------------------------------
class LinearLoss(torch.nn.Module):
    """``(w * x).sum()``: its gradient is the data, whatever the weights, so the final weights
    tell whether every gradient was applied exactly once, in whatever order and staleness."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.zeros(5, 6, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.w * x).sum(1) + (self.b * x[:, None, :]).sum((1, 2))


def linear_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return out.mean()


def plain_sgd(params: list) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1)


def stale_job(
    rank: int,
    world: int,
    addr: str,
    port: int,
    staleness: int,
    sync: bool,
    steps: int,
    model_kind: str = "dense",
    slowdown: tuple = (),
    proxy: bool = False,
    **kw: Any,
) -> RankJob:
    """A PSLoadBalancing run over every rank at the given consistency (``model_kind`` "linear":
    ``LinearLoss`` on float64 data)."""
    import distlab as dl
    from distlab.resources import ResourceSpec

    model = (
        LinearLoss()
        if model_kind == "linear"
        else MODELS["dense" if model_kind == "learnable" else model_kind]()
    )
    data = (
        learnable_data()
        if model_kind == "learnable"
        else dataset("sparse" if model_kind == "sparse" else "dense")
    )
    if model_kind == "linear":
        data = TensorDataset(data.tensors[0].double(), data.tensors[1])
        kw.setdefault("loss", linear_loss)
    strategy = dl.strategy.build(
        "PSLoadBalancing",
        profile_of(model),
        ResourceSpec.local(world),
        servers="all",
        sync=sync,
        staleness=staleness,
        local_replication=proxy,
        batch_size=BATCH,
    )
    kw.setdefault("optimizer", plain_sgd)
    return job_for(
        rank,
        world,
        addr,
        port,
        model,
        strategy,
        data=data,
        steps=steps,
        shuffle=True,
        seed=3,
        timeout=30.0,
        run_id=f"stale-{staleness}-{sync}-{model_kind}-{kw.pop('tag', '')}",
        options=RunOptions(slowdown=tuple(slowdown)),
        **kw,
    )


def learnable_data() -> TensorDataset:
    """384 dense rows whose labels a fixed linear map of the inputs decides: a loss that falls."""
    x = dataset("dense", n=384).tensors[0]
    return TensorDataset(x, (x @ torch.randn(6, 5, generator=torch.Generator().manual_seed(7))).argmax(1))


def learnable_loss(state: dict[str, torch.Tensor] | None = None) -> float:
    """The dense model's cross-entropy on all of ``learnable_data`` at its initial weights, or at
    ``state``."""
    model = dense_model()
    if state is not None:
        model.load_state_dict(state)
    x, y = learnable_data().tensors
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(x), y).item()


def linear_reference(steps: int, world: int) -> dict[str, torch.Tensor]:
    """``LinearLoss`` trained by one process on the global batch: w -= lr * mean gradient per step."""
    model = LinearLoss()
    data = dataset("dense")
    ds = TensorDataset(data.tensors[0].double(), data.tensors[1])
    opt = plain_sgd(list(model.parameters()))
    batches = RankBatches(ds, BATCH * world, 0, 1, True, 3)
    for t in range(steps):
        x, y = batches.get(t * BATCH * world)
        opt.zero_grad()
        linear_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _after(rank: int, seen: list, steps: int):
    """Rank 1's should_stop: true once it has done ``steps`` steps."""
    return lambda: rank == 1 and len(seen) >= steps


def stale_suite_body(rank: int, world: int, addr: str, port: int, directory: str) -> dict:
    """Every stale-PS behaviour the tests check, in one process group (one spawn):

    - ``once``: LinearLoss at s=1, async, and async with proxies: final weights on every rank;
    - ``learn``: a learnable task's losses at s=2 and async;
    - ``straggler``: rank ``world - 1`` slowed 100x, at s=1 and async: each rank's staleness seen;
    - ``v1``/``s0``: synchronous PS from a version-1 file and from staleness=0, bit for bit;
    - ``ckpt``: 6 steps checkpointing every 3 (momentum), and a resume from step 3.
    """
    from distlab.runtime.trainer import run_rank
    from distlab.strategy.types import Strategy as St

    out: dict = {}

    def run(key, *args, **kw):
        job = stale_job(rank, world, addr, port, *args, tag=key, **kw)
        res = run_rank(job)
        res["weights"] = {k: v.detach().clone() for k, v in job.model.state_dict().items()}
        out[key] = res
        return res

    run("once-s1", 1, True, 8, "linear")
    run("once-async", 0, False, 8, "linear")
    run("once-proxy", 0, False, 8, "linear", proxy=True)
    run("learn-s2", 2, True, 40, "learnable")
    run("sparse-s1", 1, True, 6, "sparse")  # sparse rows pushed dense, stepped as sparse on the server
    for key, s, sync in (
        ("stop-s1", 1, True),
        ("stop-async", 0, False),
    ):  # a cancel: rank 1 asks after 3 steps
        seen: list[int] = []
        job = stale_job(rank, world, addr, port, s, sync, 200, "dense", tag=key)
        res = run_rank(
            job, emit=lambda r, seen=seen: seen.append(r["step"]), should_stop=_after(rank, seen, 3)
        )
        out[key] = {"steps": res["steps"], "stopped": res["stopped"]}
    run("learn-async", 0, False, 40, "learnable")
    # the Straggler waits factor - 1 times this tiny model's compute (about 0.3 ms) while a step is
    # about 20 ms of PS traffic: at 4x the wait was under 1 ms and the fast ranks ran ahead only by
    # chance (CI, 2026-11-29: async staleness never above 1); at 100x the slow rank waits ~60 ms a step
    slow = ((world - 1, 100.0),)
    run("straggler-s1", 1, True, 10, "dense", slowdown=slow)
    run("straggler-async", 0, False, 10, "dense", slowdown=slow)
    sync = stale_job(rank, world, addr, port, 0, True, 4, "dense", tag="s0")
    v1 = sync.strategy.to_dict()
    v1["version"] = 1
    for v in v1["variables"]:
        for key in ("sync", "staleness", "local_replication"):
            v["sync"].pop(key)
    for key, strategy in (("s0", sync.strategy), ("v1", St.from_dict(v1))):
        job = stale_job(rank, world, addr, port, 0, True, 4, "dense", tag=key)
        job = dataclasses.replace(job, strategy=strategy, optimizer=sgd_momentum)
        res = run_rank(job)
        out[key] = {k: v.detach().clone() for k, v in job.model.state_dict().items()}
        out[f"{key}-record"] = res["records"][-1]
    from distlab.runtime import checkpoint

    checkpoint.save.__defaults__ = (3,)  # a run keeps only its newest checkpoint; this resumes from an older
    run("ckpt-full", 1, True, 6, "linear", checkpoint_dir=directory, checkpoint_every=3)

    path = str(checkpoint.path_for(directory, 3))
    run("ckpt-resumed", 1, True, 6, "linear", resume_from=path, start_step=3, sample_offset=3 * BATCH * world)
    momentum = f"{directory}/momentum"
    run(
        "ckpt-momentum",
        0,
        False,
        3,
        "dense",
        checkpoint_dir=momentum,
        checkpoint_every=3,
        optimizer=sgd_momentum,
    )
    out["ckpt-state"] = checkpoint.load(checkpoint.path_for(momentum, 3)) if rank == 0 else None
    return out
