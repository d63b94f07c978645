"""Gossip topologies: weighted directed graphs (static) and per-step schedules (dynamic), after BlueFog."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from distlab.errors import DistlabError

# Convention (distlab.glossary "topology"): weights[i, j] is the weight of the edge i -> j, self
# loops on the diagonal. Rank j's combine step is x_j <- sum_i weights[i, j] * x_i, so columns
# must sum to one; every built-in is doubly stochastic (rows too), which keeps the average.


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


def _metropolis_hastings(g: nx.Graph) -> np.ndarray:
    """Symmetric weights 1/max(deg_i, deg_j) per edge, degrees counting the self loop; rest on the
    diagonal."""
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


# -- static topologies ------------------------------------------------------------------------------
def exp2(n: int) -> Topology:
    """Exponential-2 graph: rank r sends to r + 2^k for every 2^k < n (BlueFog ExponentialTwoGraph)."""
    return Topology("exp2", _circulant(n, _powers(2, n)))


def exponential(n: int, base: int = 2) -> Topology:
    """Rank r sends to r + base^k for every base^k < n (BlueFog ExponentialGraph)."""
    if not isinstance(base, int) or isinstance(base, bool) or base < 2:
        raise DistlabError(f"topology exponential: base must be an integer >= 2, got {base!r}")
    return Topology(
        "exponential" if base == 2 else f"exponential(base={base})", _circulant(n, _powers(base, n))
    )


def symmetric_exponential(n: int, base: int = 2) -> Topology:
    """Undirected exponential graph: rank r talks with r +/- base^k for base^k <= n // 2."""
    if not isinstance(base, int) or isinstance(base, bool) or base < 2:
        raise DistlabError(f"topology symmetric_exponential: base must be an integer >= 2, got {base!r}")
    ks = [p for p in _powers(base, n) if p <= n // 2]
    return Topology("symmetric_exponential", _circulant(n, ks + [-k for k in ks]))


def ring(n: int, style: int = 0) -> Topology:
    """Ring (BlueFog RingGraph): style 0 self and +/-1 at 1/3; 1: send to r+1; 2: send to r-1 (1/2 each)."""
    if style not in (0, 1, 2):
        raise DistlabError(f"topology ring: style must be 0, 1 or 2, got {style!r}")
    offsets = {0: [1, -1], 1: [1], 2: [-1]}[style]
    return Topology("ring" if style == 0 else f"ring(style={style})", _circulant(n, offsets if n > 1 else []))


def star(n: int, center: int = 0) -> Topology:
    """Star around ``center`` with Metropolis-Hastings weights (doubly stochastic)."""
    if not isinstance(center, int) or not 0 <= center < n:
        raise DistlabError(f"topology star: center must be a rank in 0..{n - 1}, got {center!r}")
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from((center, r) for r in range(n) if r != center)
    return Topology("star", _metropolis_hastings(g))


def mesh2d(n: int) -> Topology:
    """4-neighbour grid of the two closest factors of n, Metropolis-Hastings weights (BlueFog
    MeshGrid2DGraph)."""
    rows, cols = _closest_factors(n)
    g = nx.convert_node_labels_to_integers(nx.grid_2d_graph(rows, cols), ordering="sorted")
    return Topology("mesh2d", _metropolis_hastings(g))


def full(n: int) -> Topology:
    """Every rank averages with every other at 1/n (equivalent to an all-reduce mean)."""
    return Topology("full", np.full((n, n), 1.0 / n))


# -- dynamic topologies ----------------------------------------------------------------------------
def one_peer_exp2(n: int) -> TopologySchedule:
    """At step t rank r sends to r + 2^(t mod K) and receives from r - 2^(t mod K), weights 1/2.

    K = number of powers of two below n (log2 n for a power of two); after K steps every rank holds
    the exact average when n is a power of two (BlueFog's dynamic Exponential-2 graph).
    """
    offsets = _powers(2, n) or [0]

    def step(t: int) -> np.ndarray:
        return _circulant(n, [offsets[t]])

    return TopologySchedule("one_peer_exp2", n, len(offsets), step)


def one_peer(topo: Topology) -> TopologySchedule:
    """A static circulant topology made dynamic: each step every rank sends to one out-neighbour in turn."""
    n = topo.n
    offsets = sorted({(j - 0) % n for j in topo.out_neighbors(0)})
    for r in range(n):
        if sorted((j - r) % n for j in topo.out_neighbors(r)) != offsets:
            raise DistlabError(
                f"topology {topo.name}: dynamic=True needs a circulant topology (exp2, exponential, "
                "symmetric_exponential, ring, full); use dynamic=False"
            )
    offsets = offsets or [0]

    def step(t: int) -> np.ndarray:
        return _circulant(n, [offsets[t]])

    return TopologySchedule(f"{topo.name}(dynamic)", n, len(offsets), step)


def _host_blocks(n: int, hosts: Sequence[str] | None, ranks_per_host: int | None) -> int:
    """Ranks per host for a two-level topology; ranks must come host by host, equally many per host."""
    if hosts is not None:
        hosts = list(hosts)
        if len(hosts) != n:
            raise DistlabError(f"topology hierarchical: hosts has {len(hosts)} entries for {n} ranks")
        order = list(dict.fromkeys(hosts))
        counts = [hosts.count(h) for h in order]
        if len(set(counts)) != 1 or hosts != [
            h for h, c in zip(order, counts, strict=True) for _ in range(c)
        ]:
            raise DistlabError(
                "topology hierarchical: needs the same number of ranks on every host, numbered host by host"
            )
        return counts[0]
    k = ranks_per_host if ranks_per_host is not None else n
    if not isinstance(k, int) or k < 1 or n % k:
        raise DistlabError(f"topology hierarchical: ranks_per_host must divide {n}, got {ranks_per_host!r}")
    return k


def hierarchical(
    n: int, hosts: Sequence[str] | None = None, ranks_per_host: int | None = None
) -> TopologySchedule:
    """Two levels: even steps a ring within each host, odd steps one-peer exp2 between hosts.

    Rank l of host h exchanges with rank l of host h + 2^j (j cycling), so inter-host traffic is one
    message per rank per outer step (BlueFog's hierarchical neighbour averaging).
    """
    k = _host_blocks(n, hosts, ranks_per_host)
    n_hosts = n // k
    inner = ring(k).weights
    outer_offsets = _powers(2, n_hosts)
    if not outer_offsets:
        return TopologySchedule("hierarchical", n, 1, lambda t: np.kron(np.eye(n_hosts), inner))

    def step(t: int) -> np.ndarray:
        if t % 2 == 0:
            return np.kron(np.eye(n_hosts), inner)
        return np.kron(_circulant(n_hosts, [outer_offsets[t // 2]]), np.eye(k))

    return TopologySchedule("hierarchical", n, 2 * len(outer_offsets), step)


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
}
DYNAMIC = ("one_peer_exp2", "hierarchical")


def names() -> list[str]:
    """Every built-in topology name (static ones first)."""
    return list(_BUILDERS)


def get(name: str, n: int, dynamic: bool = False, **options: Any) -> Topology | TopologySchedule:
    """The topology ``name`` over ``n`` ranks; ``dynamic=True`` turns a circulant one into a one-peer
    schedule."""
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
