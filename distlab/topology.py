"""Gossip topologies after BlueFog: weighted directed graphs (static) and per-step schedules (dynamic).

Every builder named after BlueFog equals its definition in ``bluefog/common/topology_util.py``
(Bluefog-Lib/bluefog at 9ee376a), option for option, weights included: ``tests/test_topology.py``
checks each against a transcription of that code (``tests/bluefog_reference.py``). Where distlab
departs from BlueFog's code the builder's docstring says how and why (``exponential``: exact powers;
``one_peer``: a rank with no out-neighbour; ``hierarchical``: BlueFog's one step as two).

Long because each of BlueFog's eleven topologies keeps its own builder, and its docstring the
convention it shares with BlueFog; splitting them would scatter one table of definitions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from distlab.errors import DistlabError

# Convention (distlab.glossary "topology"): weights[i, j] is the weight of the edge i -> j, self
# loops on the diagonal. Rank j's combine step is x_j <- sum_i weights[i, j] * x_i, so columns
# must sum to one; every built-in is doubly stochastic (rows too), which keeps the average.
# BlueFog's matrix is the same: nx.to_numpy_array(G)[i, j] is the edge i -> j, and its
# GetRecvWeights(G, j) reads column j as rank j's receive weights.


@dataclass(frozen=True, eq=False)
class Topology:
    """A static topology over ``n`` ranks."""

    name: str
    weights: np.ndarray
    dynamic: bool = False

    @property
    def n(self) -> int:
        return int(self.weights.shape[0])

    def out_neighbors(self, r: int) -> list[int]:
        """Ranks r sends to (self excluded), ascending."""
        return [int(j) for j in np.flatnonzero(self.weights[r]) if j != r]

    def in_neighbors(self, r: int) -> list[int]:
        """Ranks r receives from (self excluded), ascending."""
        return [int(i) for i in np.flatnonzero(self.weights[:, r]) if i != r]

    def in_weights(self, r: int) -> dict[int, float]:
        """Weight of each incoming edge of r, self loop included: r's combine coefficients."""
        return {int(i): float(self.weights[i, r]) for i in np.flatnonzero(self.weights[:, r])}

    def self_weight(self, r: int) -> float:
        return float(self.weights[r, r])

    @property
    def degree(self) -> int:
        """The largest number of out-neighbours of any rank (messages a rank sends per step)."""
        return max(len(self.out_neighbors(r)) for r in range(self.n))

    def spectral_gap(self) -> float:
        """1 - |lambda_2|: one minus the second-largest eigenvalue modulus of the weights.

        The consensus error shrinks by about |lambda_2| per gossip step (BlueFog, Ying et al. 2021).
        """
        if self.n == 1:
            return 1.0
        mods = np.sort(np.abs(np.linalg.eigvals(self.weights)))[::-1]
        return float(1.0 - mods[1])

    def is_doubly_stochastic(self, tol: float = 1e-9) -> bool:
        w = self.weights
        return bool(
            (w >= -tol).all() and np.allclose(w.sum(0), 1, atol=tol) and np.allclose(w.sum(1), 1, atol=tol)
        )

    def to_networkx(self) -> nx.DiGraph:
        """The topology as a weighted ``networkx.DiGraph`` (attribute ``weight``)."""
        return nx.from_numpy_array(self.weights, create_using=nx.DiGraph)

    def __repr__(self) -> str:
        return f"<Topology {self.name} n={self.n} degree={self.degree} gap={self.spectral_gap():.3f}>"


@dataclass(frozen=True, eq=False)
class TopologySchedule:
    """A dynamic topology: a different static ``Topology`` each step, repeating every ``period`` steps."""

    name: str
    n: int
    period: int
    _step: Callable[[int], np.ndarray]
    dynamic: bool = True

    def at(self, step: int) -> Topology:
        """The topology used at global step ``step``."""
        return Topology(f"{self.name}@{step % self.period}", self._step(step % self.period), dynamic=True)

    @property
    def degree(self) -> int:
        return max(self.at(t).degree for t in range(self.period))

    def spectral_gap(self) -> float:
        """Per-step gap of one period: 1 - |lambda_2(W_{p-1} ... W_0)|^(1/p)."""
        prod = np.eye(self.n)
        for t in range(self.period):
            prod = prod @ self.at(t).weights
        if self.n == 1:
            return 1.0
        lam = np.sort(np.abs(np.linalg.eigvals(prod)))[::-1][1]
        lam = 0.0 if lam < 1e-12 else lam  # exact averaging within a period (one-peer exp2)
        return float(1.0 - lam ** (1.0 / self.period))

    def __repr__(self) -> str:
        return f"<TopologySchedule {self.name} n={self.n} period={self.period}>"


# -- helpers ---------------------------------------------------------------------------------------
def _powers(base: int, n: int) -> list[int]:
    """base^0, base^1, ... below n, by integer multiplication (no float log misses at exact powers)."""
    out, p = [], 1
    while p < n:
        out.append(p)
        p *= base
    return out


def _circulant(n: int, offsets: Sequence[int]) -> np.ndarray:
    """Each rank r sends to r + k (mod n) for k in offsets, and to itself; uniform weights."""
    ks = sorted({k % n for k in offsets} | {0})
    w = np.zeros((n, n))
    for k in ks:
        w[np.arange(n), (np.arange(n) + k) % n] = 1.0 / len(ks)
    return w


def _uniform_receive(n: int, edges: Iterable[tuple[int, int]]) -> np.ndarray:
    """Each rank j averages itself and every i with an edge (i, j) at 1/(senders + 1): the weights
    BlueFog's examples give a dynamic step (self_weight and src_weights 1/(len(recv_neighbors) + 1))."""
    w = np.eye(n)
    for i, j in edges:
        w[i, j] = 1.0
    return w / w.sum(axis=0)


def _metropolis_hastings(g: nx.Graph) -> np.ndarray:
    """Symmetric weights 1/max(deg_i, deg_j) per edge, degrees counting the self loop; rest on the
    diagonal (BlueFog's "Hastings rule", MeshGrid2DGraph)."""
    nodes = list(g.nodes)
    index = {v: i for i, v in enumerate(nodes)}
    deg = {v: g.degree(v) + 1 for v in nodes}
    w = np.zeros((len(nodes), len(nodes)))
    for a, b in g.edges:
        if a != b:
            w[index[a], index[b]] = w[index[b], index[a]] = 1.0 / max(deg[a], deg[b])
    np.fill_diagonal(w, 1.0 - w.sum(1))
    return w


def _closest_factors(n: int) -> tuple[int, int]:
    a = math.isqrt(n)
    while n % a:
        a -= 1
    return a, n // a


def _check_base(name: str, base: Any) -> None:
    if not isinstance(base, int) or isinstance(base, bool) or base < 2:
        raise DistlabError(f"topology {name}: base must be an integer >= 2, got {base!r}")


# -- static topologies ------------------------------------------------------------------------------
def exp2(n: int) -> Topology:
    """Exponential-2 graph: rank r sends to r + 2^k for every 2^k < n (BlueFog ExponentialTwoGraph)."""
    return Topology("exp2", _circulant(n, _powers(2, n)))


def exponential(n: int, base: int = 2) -> Topology:
    """Rank r sends to r + base^k for every base^k < n, uniform weights (BlueFog ExponentialGraph).

    distlab follows BlueFog's documented definition, "the index difference is a power of base",
    with exact integer powers. BlueFog's code tests ``base ** int(math.log(x, base)) == x``, whose
    float log misses 3^5 = 243 and 10^3 = 1000 (the only misses for bases 2..10 below 1024): there
    BlueFog drops the edge r -> r + 243 (r + 1000) that distlab keeps.
    """
    _check_base("exponential", base)
    return Topology(
        "exponential" if base == 2 else f"exponential(base={base})", _circulant(n, _powers(base, n))
    )


def symmetric_exponential(n: int, base: int = 4) -> Topology:
    """Rank r talks with r +/- base^k for every base^k <= n // 2, uniform weights (BlueFog
    SymmetricExponentialGraph, default base 4; exact powers as ``exponential``)."""
    _check_base("symmetric_exponential", base)
    ks = [p for p in _powers(base, n) if p <= n // 2]
    name = "symmetric_exponential" if base == 4 else f"symmetric_exponential(base={base})"
    return Topology(name, _circulant(n, ks + [-k for k in ks]))


def ring(n: int, connect_style: int = 0) -> Topology:
    """Ring (BlueFog RingGraph): ``connect_style`` 0 averages self and both neighbours at 1/3;
    1 ("left") rank r sends to r - 1, 2 ("right") to r + 1, at 1/2 with 1/2 on self. One rank: the
    identity; two ranks: 1/2 everywhere whatever the style."""
    if connect_style not in (0, 1, 2) or isinstance(connect_style, bool):
        raise DistlabError(f"topology ring: connect_style must be 0, 1 or 2, got {connect_style!r}")
    offsets = {0: [1, -1], 1: [-1], 2: [1]}[connect_style]
    name = "ring" if connect_style == 0 else f"ring(connect_style={connect_style})"
    return Topology(name, _circulant(n, offsets if n > 1 else []))


def star(n: int, center_rank: int = 0) -> Topology:
    """Star around ``center_rank`` (BlueFog StarGraph): every edge 1/n, a leaf keeps 1 - 1/n and the
    centre 1/n, the Metropolis-Hastings weights of a star (doubly stochastic)."""
    if not isinstance(center_rank, int) or isinstance(center_rank, bool) or not 0 <= center_rank < n:
        raise DistlabError(f"topology star: center_rank must be a rank in 0..{n - 1}, got {center_rank!r}")
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((center_rank, r) for r in range(n) if r != center_rank)
    return Topology(
        "star" if center_rank == 0 else f"star(center_rank={center_rank})", _metropolis_hastings(g)
    )


def mesh2d(n: int, shape: tuple[int, int] | None = None) -> Topology:
    """4-neighbour grid of ``shape = (nrow, ncol)``, rank r at row r // ncol, column r % ncol, with
    Metropolis-Hastings weights (BlueFog MeshGrid2DGraph). Default shape: the two closest factors of
    n, fewer rows than columns (a prime n is a 1 x n line)."""
    if shape is None:
        shape = _closest_factors(n)
    ok = isinstance(shape, (tuple, list)) and len(shape) == 2
    if not ok or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
        raise DistlabError(
            f"topology mesh2d: shape must be (nrow, ncol) with nrow * ncol == {n}, got {shape!r}"
        )
    rows, cols = shape
    if rows * cols != n:
        raise DistlabError(
            f"topology mesh2d: shape {rows} x {cols} is {rows * cols} ranks, not {n}; pass shape=None"
        )
    g = nx.convert_node_labels_to_integers(nx.grid_2d_graph(rows, cols), ordering="sorted")
    return Topology("mesh2d", _metropolis_hastings(g))


def full(n: int) -> Topology:
    """Every rank averages with every other at 1/n (BlueFog FullyConnectedGraph; an all-reduce mean)."""
    return Topology("full", np.full((n, n), 1.0 / n))


# -- dynamic topologies ----------------------------------------------------------------------------
def one_peer(topo: Topology) -> TopologySchedule:
    """A static topology made dynamic as BlueFog's GetDynamicOnePeerSendRecvRanks does it.

    Rank r's out-neighbours sorted clockwise ((j - r) mod n); at step t rank r sends to the
    (t mod its out-degree)-th one and receives from every rank whose step-t send is r: one on a
    circulant graph, several or none where degrees differ (a star's centre hears every leaf at
    once). Weights as BlueFog's examples set them: self and each sender 1/(senders + 1). Columns
    sum to one; rows only where every rank receives once per step (circulant graphs): elsewhere the
    schedule is column-stochastic only, as BlueFog's is. Period: the lcm of the out-degrees. A rank
    with no out-neighbour (one rank) sends nothing, where BlueFog divides by zero.
    """
    n = topo.n
    succ = [sorted(topo.out_neighbors(r), key=lambda j, r=r: (j - r) % n) for r in range(n)]

    def step(t: int) -> np.ndarray:
        return _uniform_receive(n, [(r, s[t % len(s)]) for r, s in enumerate(succ) if s])

    return TopologySchedule(f"{topo.name}(dynamic)", n, math.lcm(*(len(s) for s in succ if s)), step)


def one_peer_exp2(n: int) -> TopologySchedule:
    """``one_peer(exp2(n))``: at step t rank r sends to r + 2^(t mod K) and receives from
    r - 2^(t mod K), weights 1/2, K = number of powers of two below n (BlueFog's dynamic
    Exponential-2 graph). After K steps every rank holds the exact average when n is a power of two.
    """
    return dataclasses.replace(one_peer(exp2(n)), name="one_peer_exp2")


def _host_blocks(
    name: str, n: int, hosts: Sequence[str] | None, ranks_per_host: int | None, least: int
) -> tuple[int, int]:
    """(ranks per host, hosts) of a two-level topology: equally many ranks on every host, numbered
    host by host, at least ``least`` per host and at least 2 hosts (BlueFog's preconditions)."""
    if hosts is not None:
        hosts = list(hosts)
        if len(hosts) != n:
            raise DistlabError(f"topology {name}: hosts has {len(hosts)} entries for {n} ranks")
        order = list(dict.fromkeys(hosts))
        counts = [hosts.count(h) for h in order]
        if len(set(counts)) != 1 or hosts != [h for h, c in zip(order, counts) for _ in range(c)]:
            raise DistlabError(
                f"topology {name}: needs the same number of ranks on every host, numbered host by host"
            )
        k = counts[0]
    else:
        k = ranks_per_host if ranks_per_host is not None else n
        if not isinstance(k, int) or isinstance(k, bool) or k < 1 or n % k:
            raise DistlabError(f"topology {name}: ranks_per_host must divide {n}, got {ranks_per_host!r}")
    if k == n:
        raise DistlabError(
            f"topology {name}: needs at least 2 hosts, got all {n} ranks on one; pass hosts= or "
            "ranks_per_host="
        )
    if k < least:
        raise DistlabError(
            f"topology {name}: needs at least {least} ranks per host (BlueFog's precondition), got {k}; "
            + ("use one_peer_exp2" if least == 2 else "use hierarchical, or exp2 with dynamic=True")
        )
    return k, n // k


def hierarchical(
    n: int, hosts: Sequence[str] | None = None, ranks_per_host: int | None = None
) -> TopologySchedule:
    """BlueFog's hierarchical_neighbor_allreduce over GetExp2DynamicSendRecvMachineRanks, with the
    examples' weights (1/2 own host, 1/2 the received host), as two steps per BlueFog step.

    BlueFog's step s: an all-reduce within each host, local rank 0 of host h sends the host's sum
    to local rank 0 of host h + 2^j and receives from host h - 2^j (j = s mod the number of powers
    of two below the host count), broadcasts it within the host, and every rank takes
    1/2 own-host mean + 1/2 received-host mean. Here step 2s is the host average (every rank
    receives from each rank of its host, 1/k each: the all-reduce as messages) and step 2s + 1 the
    exchange, every local rank l of host h sending to local rank l of host h + 2^j at 1/2. Both
    compose to BlueFog's matrix exactly; the traffic differs: k messages cross the link per host
    pair (one per local rank) where BlueFog sends one and broadcasts it. BlueFog's preconditions
    hold: equally many ranks per host, at least 2 hosts, at least 2 ranks per host.
    """
    k, m = _host_blocks("hierarchical", n, hosts, ranks_per_host, least=2)
    dists = _powers(2, m)
    inner = [(i, j) for i in range(n) for j in range(n) if i // k == j // k]

    def step(t: int) -> np.ndarray:
        if t % 2 == 0:
            return _uniform_receive(n, inner)
        d = dists[t // 2]
        return _uniform_receive(n, [(r, (r // k + d) % m * k + r % k) for r in range(n)])

    return TopologySchedule("hierarchical", n, 2 * len(dists), step)


def _inner_outer(name: str, n: int, k: int, m: int, inner: list[int], outer: list[int]) -> TopologySchedule:
    """BlueFog's GetInnerOuter*DynamicSendRecvRanks at index t: local rank t mod k of every host sends
    to the same local rank of host h + outer[t], the host's other ranks to the rank inner[t] ahead
    of them, one further if that reaches or passes the outgoing rank; weights 1/2."""

    def step(t: int) -> np.ndarray:
        out, d_in, d_out = t % k, inner[t % len(inner)], outer[t % len(outer)]
        sends = []
        for r in range(n):
            h, local = divmod(r, k)
            if local == out:
                sends.append((r, (h + d_out) % m * k + local))
            else:
                d = d_in + int(d_in >= (out - local) % k)
                sends.append((r, h * k + (local + d) % k))
        return _uniform_receive(n, sends)

    return TopologySchedule(name, n, math.lcm(k, len(inner), len(outer)), step)


def inner_outer_ring(
    n: int, hosts: Sequence[str] | None = None, ranks_per_host: int | None = None
) -> TopologySchedule:
    """BlueFog's GetInnerOuterRingDynamicSendRecvRanks with the examples' weights (1/2 each): at
    step t local rank t mod k of host h sends to the same local rank of host h + 1; the host's
    other ranks form a ring around it. One send and one receive per rank: doubly stochastic.
    Preconditions (BlueFog's): equally many ranks per host, at least 3, and at least 2 hosts
    (on one host BlueFog's outgoing rank would send to itself)."""
    k, m = _host_blocks("inner_outer_ring", n, hosts, ranks_per_host, least=3)
    return _inner_outer("inner_outer_ring", n, k, m, [1], [1])


def inner_outer_exp2(
    n: int, hosts: Sequence[str] | None = None, ranks_per_host: int | None = None
) -> TopologySchedule:
    """BlueFog's GetInnerOuterExpo2DynamicSendRecvRanks with the examples' weights (1/2 each): as
    ``inner_outer_ring``, but at step t the outgoing rank sends to host h + 2^(t mod K) (K powers of
    two below the host count) and the others 2^(t mod K') ahead within the host (K' powers of two
    below k - 1), skipping the outgoing rank. Preconditions as ``inner_outer_ring`` (on one host
    BlueFog's log2(0) fails)."""
    k, m = _host_blocks("inner_outer_exp2", n, hosts, ranks_per_host, least=3)
    return _inner_outer("inner_outer_exp2", n, k, m, _powers(2, k - 1), _powers(2, m))


_BUILDERS: dict[str, Callable[..., Any]] = {
    "exp2": exp2,
    "exponential": exponential,
    "symmetric_exponential": symmetric_exponential,
    "ring": ring,
    "star": star,
    "mesh2d": mesh2d,
    "full": full,
    "one_peer_exp2": one_peer_exp2,
    "hierarchical": hierarchical,
    "inner_outer_ring": inner_outer_ring,
    "inner_outer_exp2": inner_outer_exp2,
}
DYNAMIC = ("one_peer_exp2", "hierarchical", "inner_outer_ring", "inner_outer_exp2")
# two-level topologies: a strategy's ranks give their hosts (strategy/execution.py, whatif/pricing.py)
BY_HOST = ("hierarchical", "inner_outer_ring", "inner_outer_exp2")


def names() -> list[str]:
    """Every built-in topology name (static ones first)."""
    return list(_BUILDERS)


def get(name: str, n: int, dynamic: bool = False, **options: Any) -> Topology | TopologySchedule:
    """The topology ``name`` over ``n`` ranks; ``dynamic=True`` turns a static one into BlueFog's
    one-peer schedule (``one_peer``)."""
    if name not in _BUILDERS:
        raise DistlabError(f"topology {name!r} is not known; use one of: {', '.join(_BUILDERS)}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DistlabError(f"topology {name}: n must be a positive number of ranks, got {n!r}")
    fn = _BUILDERS[name]
    import inspect

    valid = [p for p in inspect.signature(fn).parameters if p != "n"]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise DistlabError(
            f"topology {name}: unknown option {unknown[0]!r}; valid: {', '.join(valid) or 'none'}"
        )
    topo = fn(n, **options)
    if dynamic and isinstance(topo, Topology):
        return one_peer(topo)
    return topo
