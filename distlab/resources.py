"""ResourceSpec: the ranks, hosts, devices, cores and links a strategy is planned for.

Long because ResourceSpec's constructors (local, from a Dask client, from YAML, AutoDist's spec or a
dict), its queries and its what-if variants are one type's API."""

from __future__ import annotations

import dataclasses
import hashlib
import html
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distlab.errors import ResourceError, check_positive

NODE_KEYS = ("address", "gpus", "cpus", "chief", "network_bandwidth", "ssh_config")

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
class RankSpec:
    """One rank: the host it runs on and its device (``cpu:0``, ``gpu:1``)."""

    rank: int
    host: str
    device: str = "cpu:0"

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "device": self.device}


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
    memory: dict[str, int] = field(default_factory=dict)  # host -> bytes its smallest worker may use

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

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, path: str | Path) -> ResourceSpec:
        """Read AutoDist's ``resource_spec.yml``: ``nodes: [{address, gpus, cpus, chief, network_bandwidth,
        ssh_config}]`` and ``ssh: {...}`` (kept, not used: distlab launches through Dask)."""
        import yaml

        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ResourceError(f"resource spec {str(path)!r}: cannot read it ({exc.strerror})") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ResourceError(
                f"resource spec {str(path)!r}: not valid YAML ({str(exc).splitlines()[0]})"
            ) from None
        return cls.from_autodist(data)

    @classmethod
    def from_autodist(cls, data: Any) -> ResourceSpec:
        """The spec from AutoDist's YAML structure already loaded into Python objects."""
        if not isinstance(data, Mapping):
            raise ResourceError("resource spec: expected a mapping with 'nodes' at the top level")
        for k in data:
            if k not in ("nodes", "ssh"):
                raise ResourceError(f"resource spec: unknown key {k!r}; valid keys: nodes, ssh")
        nodes_raw = data.get("nodes")
        if not isinstance(nodes_raw, list) or not nodes_raw:
            raise ResourceError("nodes: missing or empty; list at least one node with an address")
        ssh = data.get("ssh") or {}
        if not isinstance(ssh, Mapping):
            raise ResourceError(f"ssh: expected a mapping of named ssh settings, got {type(ssh).__name__}")
        nodes = [_parse_node(n, f"nodes[{i}]", ssh) for i, n in enumerate(nodes_raw)]
        seen: dict[str, int] = {}
        chief = None
        for i, n in enumerate(nodes):
            if n.address in seen:
                raise ResourceError(
                    f"nodes[{i}].address: duplicate {n.address!r} (also nodes[{seen[n.address]}])"
                )
            seen[n.address] = i
            if n.chief:
                if chief is not None:
                    raise ResourceError(
                        f"nodes[{i}].chief: two chiefs (nodes[{chief}] is chief already); keep one"
                    )
                chief = i
        if chief is None:  # AutoDist's single-node files often omit it: the first node leads
            nodes[0] = dataclasses.replace(nodes[0], chief=True)
        ranks: list[RankSpec] = []
        for n in nodes:
            devices = [f"gpu:{g}" for g in n.gpus] if n.gpus else [f"cpu:{c}" for c in n.cpus]
            ranks += [RankSpec(len(ranks) + k, n.address, d) for k, d in enumerate(devices)]
        bandwidths = [n.network_bandwidth for n in nodes if n.network_bandwidth is not None]
        inter = Link(DEFAULT_INTER[0], min(bandwidths) * 1e9 / 8) if bandwidths else Link(*DEFAULT_INTER)
        return cls(
            ranks=tuple(ranks),
            links={"intra": Link(*DEFAULT_INTRA), "inter": inter},
            cores={n.address: max(len(n.cpus), 1) for n in nodes},
            nodes=tuple(nodes),
            ssh=dict(ssh),
        )

    @classmethod
    def local(cls, workers: int = 2) -> ResourceSpec:
        """This machine over loopback: ``workers`` CPU ranks on host 127.0.0.1, cores counted."""
        check_positive("workers", workers, ResourceError)
        host = "127.0.0.1"
        return cls(
            ranks=tuple(RankSpec(i, host, f"cpu:{i}") for i in range(workers)),
            cores={host: available_cores()},
            nodes=(NodeSpec(host, cpus=tuple(range(available_cores())), chief=True),),
        )

    @classmethod
    def from_client(cls, client: Any, facts: Mapping[str, Mapping[str, Any]] | None = None) -> ResourceSpec:
        """A live Dask cluster: one rank per worker, ordered by (host, worker address).

        Reads the scheduler's full worker table (``scheduler.identity``; ``client.scheduler_info()``
        can briefly return an empty list while the client refreshes its cache). A worker is a GPU rank when
        its
        resources or metrics mention a GPU; cores per host are the sum of its workers' threads.
        ``facts`` (worker address -> ``{"cores": int, "gpu": id or None}``, measured on the workers)
        overrides both: cores per host = the largest reported, device ``gpu:<id>``.
        """
        try:
            workers = dict(_worker_table(client))
        except Exception as exc:  # any client-side failure is the user's cluster, not a bug here
            raise ResourceError(
                f"client: cannot read the scheduler's workers ({type(exc).__name__}: {exc})"
            ) from None
        if not workers:
            raise ResourceError(
                "client: the cluster has no workers yet; wait for them (client.wait_for_workers)"
            )
        facts = facts or {}
        rows = sorted((str(info.get("host") or host_of(addr)), addr, info) for addr, info in workers.items())
        ranks: list[RankSpec] = []
        addresses: list[str] = []
        threads: dict[str, int] = {}
        measured: dict[str, int] = {}
        per_host: dict[tuple[str, str], int] = {}
        memory: dict[str, int] = {}
        for host, addr, info in rows:
            if info.get("memory_limit"):  # a Dask worker's memory limit: what one rank may hold
                memory[host] = min(memory.get(host, 1 << 62), int(info["memory_limit"]))
            fact = facts.get(addr) or {}
            gpu = fact.get("gpu")
            # a worker given a GPU (dask-cuda sets CUDA_VISIBLE_DEVICES) or declaring one as a Dask
            # resource; the metrics' GPU only where the worker reported no facts: plain workers on
            # a GPU machine all see the same device, and NCCL refuses two ranks on one device
            kind = "gpu" if gpu not in (None, "") or _has_gpu(info, declared_only=bool(fact)) else "cpu"
            k = per_host.get((host, kind), 0)
            per_host[(host, kind)] = k + 1
            device = f"gpu:{gpu}" if gpu not in (None, "") and str(gpu).isdigit() else f"{kind}:{k}"
            ranks.append(RankSpec(len(ranks), host, device))
            addresses.append(addr)
            threads[host] = threads.get(host, 0) + int(info.get("nthreads") or 1)
            if fact.get("cores"):
                measured[host] = max(measured.get(host, 0), int(fact["cores"]))
        return cls(
            ranks=tuple(ranks), cores={**threads, **measured}, addresses=tuple(addresses), memory=memory
        )

    # -- parts of a live cluster -----------------------------------------------------------------
    def of_workers(self, addresses: Sequence[str]) -> ResourceSpec:
        """The part of this spec made of the workers at ``addresses`` (ranks renumbered in that
        order): what a run on those workers has."""
        index = {a: i for i, a in enumerate(self.addresses)}
        missing = [a for a in addresses if a not in index]
        if missing:
            raise ResourceError(
                f"of_workers: {missing[0]!r} is not a worker of this cluster ({len(index)} are)"
            )
        ranks = tuple(
            RankSpec(rank=j, host=self.ranks[index[a]].host, device=self.ranks[index[a]].device)
            for j, a in enumerate(addresses)
        )
        hosts = {r.host for r in ranks}
        return ResourceSpec(
            ranks=ranks,
            links=dict(self.links),
            cores={h: c for h, c in self.cores.items() if h in hosts},
            addresses=tuple(addresses),
        )

    def first(self, k: int) -> ResourceSpec:
        """The first ``k`` workers: what a ``k``-rank run, measurement or calibration uses."""
        return self.of_workers(self.addresses[:k])

    # -- what-if variants ------------------------------------------------------------------------
    def with_links(self, intra: Link | None = None, inter: Link | None = None) -> ResourceSpec:
        """The same ranks with new link figures (e.g. from calibration)."""
        links = dict(self.links)
        if intra is not None:
            links["intra"] = intra
        if inter is not None:
            links["inter"] = inter
        return dataclasses.replace(self, links=links)

    def with_world(self, n: int, per_host: int | None = None) -> ResourceSpec:
        """A what-if spec with ``n`` ranks spread like the current hosts.

        Default: the same hosts, ranks dealt evenly (the first hosts get one more when uneven).
        ``per_host=k``: k ranks per host, adding hosts (``host-2``, ...) when more are needed.
        Devices keep their kind (gpu or cpu); worker addresses are dropped.
        """
        check_positive("with_world: n", n, ResourceError)
        hosts = list(self.hosts) or ["127.0.0.1"]
        if per_host is not None:
            check_positive("with_world: per_host", per_host, ResourceError)
            n_hosts = math.ceil(n / per_host)
            hosts += [f"host-{i}" for i in range(len(hosts), n_hosts)]
            counts = [min(per_host, n - i * per_host) for i in range(n_hosts)]
        else:
            q, r = divmod(n, len(hosts))
            counts = [q + (i < r) for i in range(len(hosts))]
        kind = "gpu" if self.gpus else "cpu"
        ranks: list[RankSpec] = []
        first_cores = self.cores.get(hosts[0])
        cores = {}
        for host, c in zip(hosts, counts, strict=False):
            ranks += [RankSpec(len(ranks) + k, host, f"{kind}:{k}") for k in range(c)]
            if c and (self.cores.get(host) or first_cores):
                cores[host] = self.cores.get(host) or first_cores
        return ResourceSpec(ranks=tuple(ranks), links=dict(self.links), cores=cores, ssh=dict(self.ssh))

    # -- identity and serialisation ----------------------------------------------------------------
    def fingerprint(self) -> str:
        """A short stable id of the hardware layout (hosts, devices, cores): a calibration cache key.

        Link figures and worker addresses are left out: they change with calibration and restarts.
        """
        key = {"ranks": [[r.host, r.device] for r in self.ranks], "cores": sorted(self.cores.items())}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        return f"{self.world}r{self.num_hosts}h-{digest}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": [r.to_dict() for r in self.ranks],
            "links": {k: v.to_dict() for k, v in self.links.items()},
            "cores": dict(self.cores),
            "nodes": [dataclasses.asdict(n) for n in self.nodes],
            "ssh": dict(self.ssh),
            "addresses": list(self.addresses),
        }

    @classmethod
    def from_dict(cls, d: Any) -> ResourceSpec:
        """Inverse of ``to_dict``; a malformed dict is a ``ResourceError``."""
        if not isinstance(d, Mapping) or "ranks" not in d:
            raise ResourceError(
                "resource dict: expected a mapping with 'ranks'; write it with ResourceSpec.to_dict()"
            )
        try:
            ranks = tuple(
                RankSpec(int(r["rank"]), str(r["host"]), str(r.get("device", "cpu:0"))) for r in d["ranks"]
            )
            links = {
                k: Link(float(v["latency"]), float(v["bandwidth"])) for k, v in (d.get("links") or {}).items()
            }
            nodes = tuple(
                NodeSpec(**{**n, "gpus": tuple(n.get("gpus", ())), "cpus": tuple(n.get("cpus", (0,)))})
                for n in d.get("nodes", ())
            )
            spec = cls(
                ranks=ranks,
                links=links or {"intra": Link(*DEFAULT_INTRA), "inter": Link(*DEFAULT_INTER)},
                cores={str(k): int(v) for k, v in (d.get("cores") or {}).items()},
                nodes=nodes,
                ssh=dict(d.get("ssh") or {}),
                addresses=tuple(str(a) for a in d.get("addresses", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ResourceError(f"resource dict: malformed ({type(exc).__name__}: {exc})") from None
        for i, r in enumerate(spec.ranks):
            if r.rank != i:
                raise ResourceError(f"ranks[{i}].rank: expected {i}, got {r.rank}")
        if not {"intra", "inter"} <= set(spec.links):
            raise ResourceError("links: needs both 'intra' and 'inter'")
        return spec

    # -- rendering -------------------------------------------------------------------------------
    def summary(self) -> str:
        kind = "GPU" if self.gpus else "CPU"
        return f"{self.world} {kind} ranks on {self.num_hosts} host(s)"

    def __repr__(self) -> str:
        return f"<ResourceSpec {self.summary()} {self.fingerprint()}>"

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(h)}</td><td>{', '.join(str(r) for r in self.ranks_on(h))}</td>"
            f"<td>{html.escape(', '.join(self.ranks[r].device for r in self.ranks_on(h)))}</td>"
            f"<td>{self.cores.get(h, '')}</td></tr>"
            for h in self.hosts
        )
        links = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{v.latency * 1e6:.1f} us</td><td>{v.bandwidth / 1e9:.3g} "
            "GB/s</td></tr>"
            for k, v in self.links.items()
        )
        return (
            f"<p><b>{html.escape(self.summary())}</b></p>"
            "<table><tr><th>host</th><th>ranks</th><th>devices</th><th>cores</th></tr>" + rows + "</table>"
            "<table><tr><th>link</th><th>latency</th><th>bandwidth</th></tr>" + links + "</table>"
        )


# foreign load at or above this many cores (or this share of the host's cores, whichever is
# larger) disturbs a measurement: an idle desktop's daemons, a terminal and a notebook server
# use a few hundredths of a core
DISTURBED_CORES, DISTURBED_SHARE = 0.25, 0.15


def disturbed_by(foreign: float, cores: int) -> bool:
    """Whether ``foreign`` cores busy with other programs disturb a measurement on ``cores`` cores."""
    return foreign >= max(DISTURBED_CORES, DISTURBED_SHARE * cores)


def cpu_sample() -> tuple[float, float, float] | None:
    """(busy CPU seconds of the whole host, CPU seconds of this process, monotonic time), or None
    where ``/proc/stat`` cannot be read (not Linux): what ``foreign_load`` compares."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    return (sum(fields) - idle) / tick, time.process_time(), time.monotonic()


def foreign_load(before: tuple[float, float, float] | None) -> float | None:
    """Cores other processes kept busy on average since ``before`` (a ``cpu_sample``); None
    when unknown. This process's own threads are not counted."""
    after = cpu_sample()
    if before is None or after is None:
        return None
    seconds = max(after[2] - before[2], 1e-9)
    return max((after[0] - before[0]) - (after[1] - before[1]), 0.0) / seconds


def available_cores() -> int:
    """Cores this process may run on (the affinity mask when the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_of(address: str) -> str:
    """Host part of a Dask worker address: ``tcp://10.0.0.2:4567`` -> ``10.0.0.2``, ``[::1]`` unwrapped."""
    rest = address.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[1 : rest.index("]")] if "]" in rest else rest[1:]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def _has_gpu(info: Mapping[str, Any], declared_only: bool = False) -> bool:
    """The worker declares a GPU resource, or (unless ``declared_only``) its metrics show one."""
    resources = info.get("resources") or {}
    if any(str(k).lower() in ("gpu", "gpus", "cuda") and v for k, v in resources.items()):
        return True
    if declared_only:
        return False
    metrics = info.get("metrics") or {}
    return bool(metrics.get("gpu") or metrics.get("gpu_utilization") is not None or info.get("gpu"))


def _int_list(x: Any, path: str) -> tuple[int, ...]:
    if x is None:
        return ()
    if not isinstance(x, list) or any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in x):
        raise ResourceError(f"{path}: expected a list of device indices (integers >= 0), got {x!r}")
    if len(set(x)) != len(x):
        raise ResourceError(f"{path}: device listed twice in {x!r}")
    return tuple(x)


def _parse_node(n: Any, path: str, ssh: Mapping[str, Any]) -> NodeSpec:
    if not isinstance(n, Mapping):
        raise ResourceError(f"{path}: expected a mapping with an address, got {type(n).__name__}")
    for k in n:
        if k not in NODE_KEYS:
            raise ResourceError(f"{path}: unknown key {k!r}; valid keys: {', '.join(NODE_KEYS)}")
    address = n.get("address")
    if not isinstance(address, str) or not address:
        raise ResourceError(f"{path}.address: missing; give the node's IP address or host name")
    chief = n.get("chief", False)
    if not isinstance(chief, bool):
        raise ResourceError(f"{path}.chief: expected true or false, got {chief!r}")
    bw = n.get("network_bandwidth")
    if bw is not None and (
        not isinstance(bw, (int, float)) or isinstance(bw, bool) or not bw > 0 or not math.isfinite(bw)
    ):
        raise ResourceError(f"{path}.network_bandwidth: must be a positive number of Gbit/s, got {bw!r}")
    ssh_config = n.get("ssh_config")
    if ssh_config is not None:
        if not isinstance(ssh_config, str) or ssh_config not in ssh:
            known = ", ".join(map(str, ssh)) or "none defined"
            raise ResourceError(f"{path}.ssh_config: {ssh_config!r} is not a group under ssh ({known})")
    cpus = _int_list(n.get("cpus"), f"{path}.cpus") or (0,)
    return NodeSpec(
        address=address,
        gpus=_int_list(n.get("gpus"), f"{path}.gpus"),
        cpus=cpus,
        chief=chief,
        network_bandwidth=float(bw) if bw is not None else None,
        ssh_config=ssh_config,
    )


def _worker_table(client: Any) -> Mapping[str, Any]:
    """Every worker the scheduler knows, asked of the scheduler itself (duck-typed on the client)."""
    scheduler = getattr(client, "scheduler", None)
    if scheduler is not None and hasattr(client, "sync"):
        return client.sync(scheduler.identity, n_workers=-1)["workers"]
    return client.scheduler_info()["workers"]
