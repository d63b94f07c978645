"""Optimizer state in a world-independent form: one full-shape state per variable, gathered from servers.

PS optimizer state lives on the servers (one shard each), so a checkpoint gathers every
server's part to rank 0 and stitches shards back along their axis. The result does not depend
on the world size or the strategy, so an elastic restart with fewer ranks (other servers,
other shards) slices it again. Gossip replicas differ; the checkpoint keeps rank 0's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from distlab.runtime.plan import SyncUnit

Entry = tuple[str, int, int | None, dict[str, Any]]  # (variable, shard or -1, axis, state)


def _entries(opt: Any, units: list[SyncUnit], targets: dict[int, SyncUnit] | None = None) -> list[Entry]:
    if opt is None:
        return []
    by_target = targets if targets is not None else {id(u.target): u for u in units}
    out: list[Entry] = []
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if not st:
                continue
            u = by_target[id(p)]
            state = {k: (v.detach().cpu().clone() if torch.is_tensor(v) else v) for k, v in st.items()}
            out.append((u.name, -1 if u.shard is None else u.shard, u.axis, state))
    return out


def gather_state(
    local_opt: Any,
    server_opt: Any,
    units: list[SyncUnit],
    rank: int,
    world: int,
    stale: tuple[Any, dict[int, SyncUnit]] | None = None,
) -> dict[str, dict[str, Any]] | None:
    """Every variable's full optimizer state on rank 0 (``None`` on other ranks). Collective.
    ``stale``: a stale PS server's optimizer and its own tensors' units (``StalePS.targets``)."""
    mine = _entries(server_opt, units)
    if stale is not None:
        mine += _entries(stale[0], units, stale[1])
    if rank == 0:
        mine += _entries(local_opt, units)
    if world > 1:
        parts: list[Any] | None = [None] * world if rank == 0 else None
        # rank 0's own part stays here: pickling it through the gather only copied it
        dist.gather_object([] if rank == 0 else mine, parts, dst=0)
        if parts is not None:
            parts[0] = mine
    else:
        parts = [mine]
    if rank != 0:
        return None
    by_var: dict[str, list[Entry]] = {}
    for part in parts or []:
        for e in part:
            by_var.setdefault(e[0], []).append(e)
    return {name: _stitch(sorted(es, key=lambda e: e[1])) for name, es in by_var.items()}


def _stitch(entries: list[Entry]) -> dict[str, Any]:
    if len(entries) == 1 and entries[0][1] == -1:
        return entries[0][3]
    axis = entries[0][2]
    out: dict[str, Any] = {}
    for key, v in entries[0][3].items():
        if torch.is_tensor(v) and v.dim() > 0:
            out[key] = torch.cat([e[3][key] for e in entries], dim=axis)
        else:
            out[key] = v
    return out


def restore_state(
    opt: Any,
    units: list[SyncUnit],
    state: dict[str, dict[str, Any]],
    targets: dict[int, SyncUnit] | None = None,
) -> None:
    """Load each of ``opt``'s parameters' state from the per-variable form, sliced to its shard;
    ``targets``: the units of its tensors by id when they are not the units' own (a stale PS server)."""
    if opt is None:
        return
    by_target = targets if targets is not None else {id(u.target): u for u in units}
    sd = opt.state_dict()
    new_state: dict[int, dict[str, Any]] = {}
    i = 0
    for group in opt.param_groups:
        for p in group["params"]:
            u = by_target[id(p)]
            full = state.get(u.name)
            if full:
                # clone every tensor, 0-dim ones too: Adam increments ``step`` in place, and shards
                # of one variable must not share it
                new_state[i] = {
                    k: (_slice(u, v).clone().to(p.device) if torch.is_tensor(v) else v)
                    for k, v in full.items()
                }
            i += 1
    opt.load_state_dict({"state": new_state, "param_groups": sd["param_groups"]})


def _slice(u: SyncUnit, v: torch.Tensor) -> torch.Tensor:
    return u.view(v) if v.dim() > 0 and u.axis is not None else v
