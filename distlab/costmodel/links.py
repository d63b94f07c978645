"""Traffic over each host's link, per communication phase, from the strategy's placement.

Calibration measures each collective alone over every rank of the cluster, and one pair of ranks
across the link alone: what one all-reduce bucket or one PS reduce costs as the runtime runs them
(one after another). Three phases put several flows on one host's link at once, which those
measurements do not see:

- **PS values after the step**: every dense variable's broadcast from its server, all in flight
  together (gloo's binomial tree, bit 0 first: ``gloo/broadcast.cc``), and each server's changed
  rows;
- **sparse PS gathers**: every rank's rows to each server (gloo's gather: a direct send from each
  rank to the root), all servers at once;
- **gossip rounds**: every rank's message to each out-neighbour at once (hierarchical gossip's
  outer steps put every rank of a host on its link together; its inner steps cross no link).

For each, per host: the bytes entering and leaving it over the inter-host link and how many flows
carry them (``LinkLoad``). ``evaluate.py`` prices the busiest direction of the busiest host at
the link's one-way rate with the calibrated share loss per extra flow (``CostParams.incast``,
``outcast``), and a phase costs at least that: Proteus's share factor and BytePS's bytes through
the busiest NIC in one formula (``research/wave3-anchors.md`` section 1). ``bottleneck`` names the
link that bounds a phase, for what-ifs and the plan chart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distlab.strategy.types import Strategy


def host_index(strategy: Strategy) -> tuple[list[str], np.ndarray]:
    """The strategy's hosts in first-rank order and each rank's host's index in it."""
    names = list(dict.fromkeys(r.host for r in strategy.ranks))
    where = {h: i for i, h in enumerate(names)}
    return names, np.array([where[r.host] for r in strategy.ranks], dtype=np.intp)


def broadcast_edges(root: int, p: int) -> list[tuple[int, int]]:
    """Who sends to whom in gloo's broadcast from ``root`` over ``p`` ranks: a binomial tree over
    virtual ranks ``(rank - root) mod p``, clearing bit 0 first (0 -> 1, then 0 -> 2 and 1 -> 3, ...)."""
    edges = []
    bit = 1
    while bit < p:  # the ranks holding the value (virtual 0 .. bit-1) each send it on
        edges.extend(((v + root) % p, (v + bit + root) % p) for v in range(bit) if v + bit < p)
        bit *= 2
    return edges


@dataclass
class LinkLoad:
    """Bytes and flows on each host's link in one phase, both directions (a link is full duplex)."""

    hosts: np.ndarray  # rank -> host index
    n_hosts: int
    bytes_in: np.ndarray = field(init=False)
    bytes_out: np.ndarray = field(init=False)
    _flows_in: list[set[tuple[int, int]]] = field(init=False)
    _flows_out: list[set[tuple[int, int]]] = field(init=False)

    def __post_init__(self) -> None:
        self.bytes_in = np.zeros(self.n_hosts)
        self.bytes_out = np.zeros(self.n_hosts)
        self._flows_in = [set() for _ in range(self.n_hosts)]
        self._flows_out = [set() for _ in range(self.n_hosts)]

    def add(self, src: int, dst: int, nbytes: float) -> None:
        """``nbytes`` from rank ``src`` to rank ``dst``: on the link only when they are on two hosts."""
        a, b = int(self.hosts[src]), int(self.hosts[dst])
        if a == b or nbytes <= 0:
            return
        self.bytes_out[a] += nbytes
        self.bytes_in[b] += nbytes
        self._flows_out[a].add((src, dst))
        self._flows_in[b].add((src, dst))

    def flows(self) -> tuple[np.ndarray, np.ndarray]:
        """Concurrent flows (rank pairs) into and out of each host's link."""
        return (
            np.array([len(f) for f in self._flows_in], dtype=float),
            np.array([len(f) for f in self._flows_out], dtype=float),
        )

    def arrays(self) -> np.ndarray:
        """``[bytes in, flows in, bytes out, flows out]`` per host: shape (4, hosts)."""
        f_in, f_out = self.flows()
        return np.stack([self.bytes_in, f_in, self.bytes_out, f_out])


def ps_values(strategy: Strategy, messages: Iterable[tuple[int, float]]) -> np.ndarray:
    """The PS values after the step: each ``(server, bytes)`` broadcast from its server, all in flight
    together (LinkLoad.arrays)."""
    names, hosts = host_index(strategy)
    load = LinkLoad(hosts, len(names))
    p = len(hosts)
    for server, nbytes in messages:
        for src, dst in broadcast_edges(int(server) % p, p):
            load.add(src, dst, nbytes)
    return load.arrays()


def ps_gathers(strategy: Strategy, messages: Iterable[tuple[int, float]]) -> np.ndarray:
    """Sparse PS gathers: every rank sends ``bytes`` (its rows) to each ``(server, bytes)``'s server."""
    names, hosts = host_index(strategy)
    load = LinkLoad(hosts, len(names))
    for server, nbytes in messages:
        for r in range(len(hosts)):
            load.add(r, int(server) % len(hosts), nbytes)
    return load.arrays()


@dataclass(frozen=True)
class GossipRounds:
    """Per step of the topology's period: the most in-neighbours any rank has on its own host, and
    the most flows (one message each) into and out of any host's link."""

    intra_degree: np.ndarray
    flows_in: np.ndarray
    flows_out: np.ndarray


def gossip_rounds(strategy: Strategy, topology: object) -> GossipRounds:
    """What each step of the strategy's gossip puts within hosts and on their links."""
    names, hosts = host_index(strategy)
    graphs: Sequence[object] = (
        [topology.at(t) for t in range(topology.period)]  # type: ignore[attr-defined]
        if hasattr(topology, "at")
        else [topology]
    )
    intra, f_in, f_out = [], [], []
    for g in graphs:
        w = np.asarray(g.weights)  # type: ignore[attr-defined]
        edge = (w != 0) & ~np.eye(w.shape[0], dtype=bool)  # i -> j
        same = hosts[:, None] == hosts[None, :]
        intra.append(float((edge & same).sum(axis=0).max()) if len(hosts) else 0.0)
        load = LinkLoad(hosts, len(names))
        for i, j in zip(*np.nonzero(edge & ~same)):
            load.add(int(i), int(j), 1.0)
        a, b = load.flows()
        f_in.append(float(a.max(initial=0.0)))
        f_out.append(float(b.max(initial=0.0)))
    return GossipRounds(np.array(intra), np.array(f_in), np.array(f_out))


def link_fields(
    strategy: Strategy,
    values: list[tuple[int, float]],
    values_state: list[tuple[int, float]],
    gathers: list[tuple[int, float]],
    gossip: bool,
) -> dict[str, object]:
    """CompiledStrategy's per-host traffic fields from the PS values each server broadcasts (plain, and
    under a stateful optimizer), the sparse rows each rank gathers to each server and whether the
    strategy gossips: empty on one host (the calibrated collectives already price it)."""
    names, _ = host_index(strategy)
    if len(names) < 2:
        return {}
    out: dict[str, object] = {
        "link_hosts": tuple(names),
        "values_link": ps_values(strategy, values),
        "values_link_state": ps_values(strategy, values_state),
        "gather_link": ps_gathers(strategy, gathers),
    }
    if gossip and strategy.gossip is not None:
        from distlab.strategy.execution import for_strategy

        rounds = gossip_rounds(strategy, for_strategy(strategy))
        out.update(
            gossip_intra_degree=rounds.intra_degree,
            gossip_flows_in=rounds.flows_in,
            gossip_flows_out=rounds.flows_out,
        )
    return out


def share(flows: np.ndarray, loss: float) -> np.ndarray:
    """How many single flows' time ``flows`` concurrent flows through one link take: ``k (1 + loss (k - 1))``
    (``loss``: CostParams.incast or outcast; 0 flows take none)."""
    return flows * (1.0 + loss * np.maximum(flows - 1.0, 0.0))


def round_share(f_in: np.ndarray, f_out: np.ndarray, incast: float, outcast: float) -> np.ndarray:
    """Per gossip round, its busiest link direction's flows as single flows' time (each one message)."""
    return np.maximum(share(f_in, incast), share(f_out, outcast))


def shared_time(
    load: np.ndarray, beta: np.ndarray | float, incast: float, outcast: float
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds the busiest direction of the busiest host's link needs for ``load`` (``[..., 4, hosts]``
    as LinkLoad.arrays, stacked): ``bytes beta (1 + share (flows - 1))`` per host and direction, and
    the index of that host and direction (``2 host + 1`` for out)."""
    b_in, f_in, b_out, f_out = (load[..., i, :] for i in range(4))
    t_in = b_in * share(f_in, incast) / np.maximum(f_in, 1.0)
    t_out = b_out * share(f_out, outcast) / np.maximum(f_out, 1.0)
    both = np.stack([t_in, t_out], axis=-1).reshape(*t_in.shape[:-1], -1)  # host-major, in before out
    which = both.argmax(axis=-1)
    return np.asarray(beta) * both.max(axis=-1, initial=0.0), which


def name_link(hosts: Sequence[str], which: int) -> str:
    """``"into 10.9.0.2"`` / ``"out of 10.9.0.2"`` for ``shared_time``'s index."""
    h, out = divmod(int(which), 2)
    host = hosts[h] if h < len(hosts) else f"host {h}"
    return f"{'out of' if out else 'into'} {host}"


PHASES = {
    "values_link": "the servers' new values after the step",
    "gather_link": "the sparse rows gathered to the servers",
}


def bottleneck(
    c: object,
    send_beta: float,
    exchange_beta: float,
    incast: float,
    outcast: float,
    step_time: float,
    stateful: bool = False,
) -> str | None:
    """The host link that bounds a phase of a compiled strategy on several hosts, in words, when that
    phase's traffic takes 10% of the step or more: which link, in which direction, how many bytes in
    how many flows, for which phase (``stateful``: under momentum or Adam, the PS values with every
    row of state). None on one host or when no link is that busy."""
    hosts: tuple[str, ...] = getattr(c, "link_hosts", ())
    if not hosts or step_time <= 0:
        return None
    found: list[tuple[float, str]] = []
    for name, phase in PHASES.items():
        load = getattr(c, f"{name}_state" if stateful and name == "values_link" else name)
        if not load.size or not load.any():
            continue
        seconds, which = shared_time(load[None], send_beta, incast, outcast)
        h, out = divmod(int(which[0]), 2)
        nbytes, flows = load[2 if out else 0, h], load[3 if out else 1, h]
        found.append(
            (float(seconds[0]), f"{name_link(hosts, int(which[0]))}: {_flows(nbytes, flows)} for {phase}")
        )
    period = len(getattr(c, "gossip_intra_degree", ()))
    if period and getattr(c, "gossip_bytes", 0.0):
        f_in, f_out = c.gossip_flows_in, c.gossip_flows_out  # type: ignore[attr-defined]
        flows = np.maximum(f_in, f_out)
        if flows.any():
            shared = round_share(f_in, f_out, incast, outcast)
            nbytes = float(c.gossip_bytes)  # type: ignore[attr-defined]
            seconds = float(shared.mean()) * nbytes * exchange_beta
            busiest = int(flows.max())
            crossing = f"{int((flows > 0).sum())} of {period} rounds cross hosts"
            moved = _flows(busiest * nbytes, busiest)
            text = f"each host's link: {moved} in its busiest gossip round ({crossing})"
            found.append((seconds, text))
    if not found:
        return None
    seconds, text = max(found)
    if seconds < 0.1 * step_time:
        return None
    return f"bottleneck: {text}, {seconds * 1e3:,.0f} ms of the {step_time * 1e3:,.0f} ms step"


def _flows(nbytes: float, flows: float) -> str:
    k = int(flows)
    return f"{nbytes / 1e6:,.1f} MB in {k} flow{'s' if k != 1 else ''}"


def fit_shared_link(rows: Sequence[Any], send: tuple[float, float] | None) -> dict[str, Any]:
    """``incast`` and ``outcast`` (CostParams) from the rows where ``flows`` ranks sent into (out of) one
    host's link at once, against one flow's ``send`` (alpha, beta): each row's extra time per byte over
    ``flows`` times one flow's, per flow beyond the first; the median over sizes. ``errors``: the
    median relative error of the fitted figure on its rows. None measured (one host): nothing."""
    out: dict[str, Any] = {"errors": {}}
    if send is None:
        return out
    alpha, beta = send
    for name in ("incast", "outcast"):
        sel = [r for r in rows if r.collective == name and r.flows and int(r.flows) >= 2 and r.seconds > 0]
        if not sel or beta <= 0:
            continue
        k = np.array([float(r.flows or 1) for r in sel])
        n = np.array([float(r.nbytes) for r in sel])
        t = np.array([float(r.seconds) for r in sel])
        per_flow = (np.maximum(t - alpha, 0.0) / (k * n * beta) - 1.0) / (k - 1.0)
        out[name] = max(float(np.median(per_flow)), 0.0)  # k flows never beat the link's own rate
        model = alpha + k * n * beta * (1.0 + out[name] * (k - 1.0))
        out["errors"][name] = float(np.median(np.abs(model / t - 1.0)))
    return out


def one_way_exchange(ab: dict[str, tuple[float, float]]) -> tuple[float, float] | None:
    """Price a pairwise exchange between hosts (``sendrecv/inter``, what gossip's rounds cost) at
    the link's one-way rate (``send/inter``'s beta; its own alpha kept), in ``ab``; returns the
    exchange's own fit, or None when either was not measured.

    A link is full duplex, so each direction of an exchange can take the whole one-way rate. The
    exchange measured alone did not repeat: on one emulated 25 MB/s link, calibrations measured it
    at 12.2 or 23.3 MB/s while the one-way rate held at 23.9-24.0 (datasets/measurements/README.md);
    the one-way rate is the figure that repeats."""
    send, measured = ab.get("send/inter"), ab.get("sendrecv/inter")
    if send is None or measured is None:
        return None
    ab["sendrecv/inter"] = (measured[0], send[1])
    return measured
