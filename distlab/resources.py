"""ResourceSpec: the ranks, hosts, devices, cores and links a strategy is planned for."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distlab.strategy.types import RankSpec

# Defaults before calibration: loopback/shared memory within a host, 10 Gbit/s between hosts.
DEFAULT_INTRA = (20e-6, 2.0e9)
DEFAULT_INTER = (50e-6, 10e9 / 8)


@dataclass(frozen=True)
class Link:
    """Alpha-beta figures of one link class: latency (s) and bandwidth (bytes/s)."""

    latency: float
    bandwidth: float

    def time(self, nbytes: float) -> float:
        """alpha + n * beta for one message of ``nbytes`` (beta = 1 / bandwidth)."""
        return self.latency + nbytes / self.bandwidth

    def to_dict(self) -> dict[str, float]:
        return {"latency": self.latency, "bandwidth": self.bandwidth}


@dataclass(frozen=True)
class NodeSpec:
    """One node of AutoDist's ``resource_spec.yml``."""

    address: str
    gpus: tuple[int, ...] = ()
    cpus: tuple[int, ...] = (0,)
    chief: bool = False
    network_bandwidth: float | None = None  # Gbit/s, as in the YAML
    ssh_config: str | None = None


@dataclass(frozen=True)
class ResourceSpec:
    """Ranks (ordered by host, then device), cores per host and per-class link figures.

    ``links`` maps ``"intra"`` (within a host) and ``"inter"`` (between hosts) to a ``Link``.
    """

    ranks: tuple[RankSpec, ...]
    links: dict[str, Link] = field(
        default_factory=lambda: {"intra": Link(*DEFAULT_INTRA), "inter": Link(*DEFAULT_INTER)}
    )
    cores: dict[str, int] = field(default_factory=dict)  # host -> cores
    nodes: tuple[NodeSpec, ...] = ()
    ssh: dict[str, Any] = field(default_factory=dict)
    addresses: tuple[str, ...] = ()  # Dask worker address per rank, when built from a client

    @property
    def world(self) -> int:
        return len(self.ranks)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Hosts in rank order, each once."""
        seen: dict[str, None] = {}
        for r in self.ranks:
            seen.setdefault(r.host, None)
        return tuple(seen)

    @property
    def num_hosts(self) -> int:
        return len(self.hosts)

    @property
    def gpus(self) -> bool:
        return any(r.device.startswith("gpu") for r in self.ranks)

    def ranks_on(self, host: str) -> tuple[int, ...]:
        return tuple(r.rank for r in self.ranks if r.host == host)

    def link(self, a: int, b: int) -> Link:
        """The link class between ranks a and b."""
        same = self.ranks[a].host == self.ranks[b].host
        return self.links["intra" if same else "inter"]

    @property
    def bottleneck(self) -> Link:
        """The slowest link class in use: inter-host when there are several hosts."""
        return self.links["inter"] if self.num_hosts > 1 else self.links["intra"]

    def ranks_per_core(self) -> float:
        """How many ranks share one core on the busiest host (>1 means contention)."""
        worst = 0.0
        for host in self.hosts:
            n = len(self.ranks_on(host))
            if any(r.device.startswith("gpu") for r in self.ranks if r.host == host):
                continue
            c = self.cores.get(host) or n
            worst = max(worst, n / c)
        return max(worst, 1.0) if worst else 1.0
