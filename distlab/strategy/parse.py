"""Strategies from JSON, checked: a ``Strategy`` out, or one ``StrategyError`` naming the field.

Long because the format's every field is read and checked here, in the order it is written."""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from distlab.errors import DistlabError, StrategyError
from distlab.strategy.types import (
    ASYNC_GOSSIP_MODES,
    BACKENDS,
    COMPRESSORS,
    GOSSIP_MODES,
    LR_SCALING,
    STRATEGY_VERSION,
    SYNC_KINDS,
    BatchConfig,
    GossipConfig,
    Partition,
    RankSpec,
    Strategy,
    Sync,
    VariablePlan,
)

if TYPE_CHECKING:
    from distlab.profiling.model_profile import ModelProfile
    from distlab.resources import ResourceSpec

DEVICE_RE = re.compile(r"^(cpu|gpu):[0-9]+$")
# Kernels that can move a sparse (indices + values) gradient; allreduce and gossip are dense-only.
SPARSE_KINDS = ("ps", "allgather")


def _fail(path: str, msg: str) -> StrategyError:
    return StrategyError(f"{path}: {msg}")


def _tname(x: Any) -> str:
    return "null" if x is None else type(x).__name__


# -- typed readers ------------------------------------------------------------------------------
def _obj(x: Any, path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise _fail(path, f"expected an object, got {_tname(x)}")
    for k in x:
        if not isinstance(k, str) or k not in required + optional:
            raise _fail(path, f"unknown key {k!r}; valid keys: {', '.join(required + optional)}")
    for k in required:
        if k not in x:
            raise _fail(f"{path}.{k}" if path else k, "missing")
    return x


def _int(x: Any, path: str, lo: int | None = None) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise _fail(path, f"expected an integer, got {_tname(x)} {x!r}"[:200])
    if lo is not None and x < lo:
        raise _fail(path, f"must be >= {lo}, got {x}")
    return x


def _str(x: Any, path: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(x, str):
        raise _fail(path, f"expected a string, got {_tname(x)}")
    if choices is not None and x not in choices:
        raise _fail(path, f"{x!r}"[:80] + f" is not one of: {', '.join(choices)}")
    return x


def _list(x: Any, path: str) -> list[Any]:
    if not isinstance(x, list):
        raise _fail(path, f"expected a list, got {_tname(x)}")
    return x


def _json_value(x: Any, path: str, depth: int = 0) -> Any:
    """Builder options: plain JSON values only (so the round trip is exact)."""
    if depth > 20:
        raise _fail(path, "nested too deeply")
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        if not math.isfinite(x):
            raise _fail(path, f"must be a finite number, got {x!r}")
        return x
    if isinstance(x, list):
        return [_json_value(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(x)]
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if not isinstance(k, str):
                raise _fail(path, f"keys must be strings, got {_tname(k)}")
            out[k] = _json_value(v, f"{path}.{k}", depth + 1)
        return out
    raise _fail(path, f"expected a JSON value, got {_tname(x)}")


# -- structure ------------------------------------------------------------------------------------
PS_CONSISTENCY = ("sync", "staleness", "local_replication")  # version 2 fields of a ps sync


def _parse_sync(x: Any, path: str, version: int = STRATEGY_VERSION) -> Sync:
    kind = _str(
        _obj(x, path, ("kind",), ("group", "compressor", "server", *PS_CONSISTENCY))["kind"],
        f"{path}.kind",
        SYNC_KINDS,
    )
    allowed = {"allreduce": ("group", "compressor"), "ps": ("server", *PS_CONSISTENCY)}.get(
        kind, ("compressor",)
    )
    for k in x:
        if k != "kind" and k not in allowed:
            if k == "compressor":
                raise _fail(
                    f"{path}.compressor", f"only allreduce compresses; {kind} sync takes no compressor"
                )
            if k in PS_CONSISTENCY:
                raise _fail(f"{path}.{k}", f"only a ps sync has a consistency; {kind} sync is synchronous")
            raise _fail(
                f"{path}.{k}", f"not a field of a {kind} sync (valid: {', '.join(allowed) or 'none'})"
            )
    compressor = _str(x.get("compressor", "none"), f"{path}.compressor", COMPRESSORS)
    if kind != "allreduce" and compressor != "none":
        raise _fail(f"{path}.compressor", f"only allreduce compresses; {kind} sync takes no compressor")
    if kind == "allreduce":
        return Sync("allreduce", group=_int(x.get("group", 0), f"{path}.group", 0), compressor=compressor)
    if kind == "ps":
        if "server" not in x:
            raise _fail(f"{path}.server", "missing (a ps sync needs its server rank)")
        given = [k for k in PS_CONSISTENCY if k in x]
        if given and version < 2:
            raise _fail(f"{path}.{given[0]}", f"version {version} has no {given[0]}; write version 2")
        return Sync(
            "ps",
            server=_int(x["server"], f"{path}.server", 0),
            sync=_bool(x.get("sync", True), f"{path}.sync"),
            staleness=_int(x.get("staleness", 0), f"{path}.staleness", 0),
            local_replication=_bool(x.get("local_replication", False), f"{path}.local_replication"),
        )
    return Sync(kind)


def _bool(x: Any, path: str) -> bool:
    if not isinstance(x, bool):
        raise _fail(path, f"expected true or false, got {_tname(x)}")
    return x


def _parse_variable(x: Any, path: str, version: int) -> VariablePlan:
    d = _obj(x, path, ("name",), ("sync", "partition", "shards"))
    name = _str(d["name"], f"{path}.name")
    if not name:
        raise _fail(f"{path}.name", "must not be empty")
    if "partition" in d:
        if "sync" in d:
            raise _fail(
                f"{path}.sync", "a partitioned variable gives one sync per shard in 'shards', not 'sync'"
            )
        p = _obj(d["partition"], f"{path}.partition", ("axis", "shards"))
        part = Partition(
            _int(p["axis"], f"{path}.partition.axis", 0), _int(p["shards"], f"{path}.partition.shards", 2)
        )
        if "shards" not in d:
            raise _fail(f"{path}.shards", f"missing (one entry per shard, {part.shards} expected)")
        entries = _list(d["shards"], f"{path}.shards")
        syncs = []
        for j, e in enumerate(entries):
            sp = f"{path}.shards[{j}]"
            syncs.append(_parse_sync(_obj(e, sp, ("sync",))["sync"], f"{sp}.sync", version))
        return VariablePlan(name, partition=part, shards=tuple(syncs))
    if "shards" in d:
        raise _fail(f"{path}.shards", "given without a 'partition'; add partition {axis, shards}")
    if "sync" not in d or d["sync"] is None:
        raise _fail(f"{path}.sync", "missing (every variable needs a sync, or a partition with shards)")
    return VariablePlan(name, sync=_parse_sync(d["sync"], f"{path}.sync", version))


def _parse_gossip(x: Any, version: int) -> GossipConfig:
    gd = _obj(x, "gossip", ("topology",), ("dynamic", "mode", "asynchronous"))
    flags = {}
    for key in ("dynamic", "asynchronous"):
        flags[key] = gd.get(key, False)
        if not isinstance(flags[key], bool):
            raise _fail(f"gossip.{key}", f"expected true or false, got {_tname(flags[key])}")
    if "asynchronous" in gd and version < 3:
        raise _fail("gossip.asynchronous", f"version {version} has no asynchronous gossip; write version 3")
    modes = ASYNC_GOSSIP_MODES if flags["asynchronous"] else GOSSIP_MODES
    mode = _str(gd.get("mode", modes[0]), "gossip.mode")  # its choices: _check_gossip, which says why
    return GossipConfig(
        _str(gd["topology"], "gossip.topology"), flags["dynamic"], mode, flags["asynchronous"]
    )


def _parse(d: Any) -> Strategy:
    top = _obj(
        d, "strategy", ("version", "ranks", "variables"), ("builder", "servers", "backend", "batch", "gossip")
    )
    version = _int(top["version"], "version", 1)
    if version > STRATEGY_VERSION:
        raise _fail(
            "version", f"{version} is newer than this distlab reads ({STRATEGY_VERSION}); upgrade distlab"
        )
    builder, options = "custom", {}
    if "builder" in top:
        b = _obj(top["builder"], "builder", ("name",), ("options",))
        builder = _str(b["name"], "builder.name")
        opts = b.get("options", {})
        if not isinstance(opts, dict):
            raise _fail("builder.options", f"expected an object, got {_tname(opts)}")
        options = _json_value(opts, "builder.options")
    ranks = []
    for i, r in enumerate(_list(top["ranks"], "ranks")):
        rd = _obj(r, f"ranks[{i}]", ("rank", "host"), ("device",))
        ranks.append(
            RankSpec(
                _int(rd["rank"], f"ranks[{i}].rank", 0),
                _str(rd["host"], f"ranks[{i}].host"),
                _str(rd.get("device", "cpu:0"), f"ranks[{i}].device"),
            )
        )
    servers = tuple(
        _int(s, f"servers[{i}]", 0) for i, s in enumerate(_list(top.get("servers", []), "servers"))
    )
    backend = _str(top.get("backend", "auto"), "backend", BACKENDS)
    batch = BatchConfig()
    if "batch" in top:
        bd = _obj(top["batch"], "batch", (), ("per_replica", "accumulation", "lr_scaling"))
        batch = BatchConfig(
            _int(bd.get("per_replica", 32), "batch.per_replica", 1),
            _int(bd.get("accumulation", 1), "batch.accumulation", 1),
            _str(bd.get("lr_scaling", "none"), "batch.lr_scaling", LR_SCALING),
        )
    gossip = None
    if top.get("gossip") is not None:
        gossip = _parse_gossip(top["gossip"], version)
    variables = tuple(
        _parse_variable(v, f"variables[{i}]", version)
        for i, v in enumerate(_list(top["variables"], "variables"))
    )
    return Strategy(variables, tuple(ranks), servers, backend, batch, gossip, builder, options, version)


# -- meaning -----------------------------------------------------------------------------------
def _check_sync(s: Sync, path: str, st: Strategy, var: Any, groups: dict[int, tuple[str, str]]) -> None:
    n = len(st.ranks)
    if s.kind not in SYNC_KINDS:
        raise _fail(f"{path}.kind", f"{s.kind!r} is not one of: {', '.join(SYNC_KINDS)}")
    if s.kind != "allreduce" and s.compressor != "none":
        raise _fail(f"{path}.compressor", f"only allreduce compresses; {s.kind} sync takes no compressor")
    if s.kind == "ps":
        if not isinstance(s.server, int) or isinstance(s.server, bool) or not 0 <= s.server < n:
            raise _fail(f"{path}.server", f"rank {s.server} does not exist ({n} ranks)")
        if st.servers and s.server not in st.servers:
            raise _fail(f"{path}.server", f"rank {s.server} is not in servers {list(st.servers)}")
        _check_consistency(s, path, st)
    elif (s.sync, s.staleness, s.local_replication) != (True, 0, False):
        raise _fail(f"{path}.kind", f"only a ps sync has a consistency; {s.kind} sync is synchronous")
    if s.kind == "allreduce":
        if not isinstance(s.group, int) or isinstance(s.group, bool) or s.group < 0:
            raise _fail(f"{path}.group", f"must be an integer >= 0, got {s.group!r}")
        if s.compressor not in COMPRESSORS:
            raise _fail(f"{path}.compressor", f"{s.compressor!r} is not one of: {', '.join(COMPRESSORS)}")
        first = groups.setdefault(s.group, (s.compressor, path))
        if first[0] != s.compressor:
            raise _fail(
                f"{path}.compressor",
                f"group {s.group} mixes {s.compressor!r} with {first[0]!r} ({first[1]}); one compressor per "
                "group",
            )
    if s.kind == "gossip" and st.gossip is None:
        raise _fail(
            f"{path}.kind", "gossip sync needs the global 'gossip' settings {topology, dynamic, mode}"
        )
    if var is not None:
        if var.sparse and s.kind not in SPARSE_KINDS:
            raise _fail(
                f"{path}.kind",
                f"{var.name!r} has sparse gradients; {s.kind} is dense-only (use "
                f"{' or '.join(SPARSE_KINDS)})",
            )
        if s.kind == "allgather" and not (var.sparse or var.embedding):
            raise _fail(
                f"{path}.kind", f"allgather moves sparse gradients; {var.name!r} is dense (use allreduce)"
            )


def _check_consistency(s: Sync, path: str, st: Strategy) -> None:
    """AutoDist's rule (staleness needs sync) and distlab's: one consistency per strategy, which
    the runtime keeps for all its PS variables."""
    if not isinstance(s.staleness, int) or isinstance(s.staleness, bool) or s.staleness < 0:
        raise _fail(f"{path}.staleness", f"must be an integer >= 0, got {s.staleness!r}")
    if s.staleness > 0 and not s.sync:
        raise _fail(
            f"{path}.staleness",
            f"{s.staleness} with sync false; staleness bounds a synchronous PS (AutoDist: 'if staleness is "
            "positive, sync has to be set true'): set sync true, or staleness 0 for asynchronous PS",
        )
    first = st.consistency
    if s.consistency != first:
        raise _fail(
            f"{path}.staleness" if s.sync == first[0] else f"{path}.sync",
            f"sync {str(s.sync).lower()}, staleness {s.staleness} here but sync {str(first[0]).lower()}, "
            f"staleness {first[1]} on an earlier PS variable; one consistency per strategy",
        )


def _check_gossip(st: Strategy) -> None:
    from distlab import topology
    from distlab.strategy.execution import for_strategy

    g = st.gossip
    if g is None:
        return
    if g.topology not in topology.names():
        raise _fail(
            "gossip.topology", f"{g.topology!r} is not known; use one of: {', '.join(topology.names())}"
        )
    modes = ASYNC_GOSSIP_MODES if g.asynchronous else GOSSIP_MODES
    if g.mode not in modes:
        kind = "an asynchronous" if g.asynchronous else "a synchronous"
        raise _fail("gossip.mode", f"{g.mode!r} is not {kind} gossip mode; use one of: {', '.join(modes)}")
    if g.asynchronous:
        for i, v in enumerate(st.variables):
            kinds = {s.kind for s in v.syncs}
            if kinds != {"gossip"}:
                raise _fail(
                    f"variables[{i}].sync.kind",
                    f"{v.name!r} is synchronised by {'/'.join(sorted(kinds))}: asynchronous gossip has no "
                    "collective per step, so every variable must be gossip",
                )
    if g.topology in topology.DYNAMIC and not g.dynamic:
        raise _fail("gossip.dynamic", f"topology {g.topology!r} is dynamic; set dynamic: true")
    if len(st.ranks) > 512:
        return  # building an n x n matrix to check it is not worth it at this size
    try:
        for_strategy(st)
    except DistlabError as exc:
        raise _fail("gossip.topology", str(exc)) from None


def check(st: Strategy, profile: ModelProfile | None = None) -> Strategy:
    """Check a structurally sound strategy's meaning; with a profile, its fit to the model."""
    n = len(st.ranks)
    if n == 0:
        raise _fail("ranks", "empty; a strategy needs at least one rank")
    for i, r in enumerate(st.ranks):
        if r.rank != i:
            raise _fail(
                f"ranks[{i}].rank", f"expected {i} (ranks are listed in order 0..{n - 1}), got {r.rank}"
            )
        if not DEVICE_RE.match(r.device):
            raise _fail(f"ranks[{i}].device", f"{r.device!r}"[:80] + " is not 'cpu:N' or 'gpu:N'")
        if not r.host:
            raise _fail(f"ranks[{i}].host", "must not be empty")
    for i, s in enumerate(st.servers):
        if not 0 <= s < n:
            raise _fail(f"servers[{i}]", f"rank {s} does not exist ({n} ranks)")
        if s in st.servers[:i]:
            raise _fail(f"servers[{i}]", f"rank {s} listed twice")
    _check_gossip(st)
    by_name = {v.name: v for v in profile.variables} if profile is not None else {}
    seen: dict[str, int] = {}
    groups: dict[int, tuple[str, str]] = {}
    for i, p in enumerate(st.variables):
        path = f"variables[{i}]"
        if p.name in seen:
            raise _fail(f"{path}.name", f"{p.name!r} repeated (first at variables[{seen[p.name]}])")
        seen[p.name] = i
        var = by_name.get(p.name)
        if profile is not None and var is None:
            raise _fail(f"{path}.name", f"{p.name!r} is not a variable of profile {profile.name!r}")
        if p.partition is None:
            if p.sync is None:
                raise _fail(
                    f"{path}.sync", "missing (every variable needs a sync, or a partition with shards)"
                )
            _check_sync(p.sync, f"{path}.sync", st, var, groups)
            continue
        part = p.partition
        if part.shards < 2:
            raise _fail(
                f"{path}.partition.shards", f"must be >= 2, got {part.shards}; use a plain sync instead"
            )
        if len(p.shards) != part.shards:
            raise _fail(f"{path}.shards", f"{len(p.shards)} entries for partition.shards {part.shards}")
        if var is not None:
            if part.axis >= len(var.shape):
                raise _fail(f"{path}.partition.axis", f"{part.axis} out of range for shape {list(var.shape)}")
            if part.shards > var.shape[part.axis]:
                raise _fail(
                    f"{path}.partition.shards",
                    f"{part.shards} shards > dimension {part.axis} of size {var.shape[part.axis]}",
                )
            if var.sparse and part.axis != 0:
                raise _fail(
                    f"{path}.partition.axis", f"{var.name!r} has sparse gradients; split by rows (axis 0)"
                )
        for j, s in enumerate(p.shards):
            _check_sync(s, f"{path}.shards[{j}].sync", st, var, groups)
    if profile is not None:
        missing = [v.name for v in profile.variables if v.name not in seen]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            verb = "have" if more else "has"
            raise _fail("variables", f"{missing[0]!r}{more} from profile {profile.name!r} {verb} no plan")
    return st


def parse_strategy(d: Any, profile: ModelProfile | None = None) -> Strategy:
    """A ``Strategy`` from its dict form (``Strategy.to_dict``), checked; any fault: a StrategyError."""
    try:
        return check(_parse(d), profile)
    except StrategyError:
        raise
    except (RecursionError, MemoryError):
        raise StrategyError("strategy: nested too deeply or too large to read") from None
    except Exception as exc:  # the contract: nothing but StrategyError escapes, whatever the input
        raise StrategyError(f"strategy: malformed ({type(exc).__name__}: {exc})"[:300]) from None


def parse_strategy_json(text: Any, profile: ModelProfile | None = None) -> Strategy:
    """A ``Strategy`` from JSON text, validated."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = text.decode()
        except UnicodeDecodeError:
            raise StrategyError("strategy JSON: not UTF-8 text") from None
    if not isinstance(text, str):
        raise StrategyError(f"strategy JSON: expected text, got {_tname(text)}")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StrategyError(
            f"strategy JSON: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except (RecursionError, ValueError) as exc:
        raise StrategyError(f"strategy JSON: cannot read it ({type(exc).__name__})") from None
    return parse_strategy(d, profile)


def validate(
    strategy: Strategy, profile: ModelProfile | None = None, resources: ResourceSpec | None = None
) -> Strategy:
    """Validate a constructed ``Strategy`` (e.g. a builder's output) against a profile and resources."""
    if not isinstance(strategy, Strategy):
        raise StrategyError(f"strategy: expected a Strategy, got {_tname(strategy)}")
    for i, p in enumerate(strategy.variables):
        for j, s in enumerate(p.syncs):
            where = f"variables[{i}]" + (f".shards[{j}]" if p.partition is not None else "")
            if s.kind == "allreduce" and not isinstance(s.group, int):
                raise _fail(f"{where}.sync.group", f"must be an integer >= 0, got {s.group!r}")
    try:
        d = strategy.to_dict()
        json.dumps(d)
    except (TypeError, ValueError, AttributeError) as exc:
        raise StrategyError(f"strategy: cannot be written as JSON ({exc})"[:300]) from None
    parse_strategy(d, profile)
    if resources is not None:
        if len(resources.ranks) != len(strategy.ranks):
            counts = f"strategy has {len(strategy.ranks)} ranks, resources {len(resources.ranks)}"
            raise _fail("ranks", counts)
        for i, (a, b) in enumerate(zip(strategy.ranks, resources.ranks, strict=True)):
            if (a.host, a.device) != (b.host, b.device):
                raise _fail(f"ranks[{i}]", f"{a.host} {a.device} != resources' {b.host} {b.device}")
    return strategy
