"""Two emulated hosts on this machine: network namespaces joined by a rate-limited link, a Dask
scheduler and workers started in them with the ``dask`` command line.

Each host is a network namespace with its own address, its share of the cores (``taskset``) and
``workers_per_host`` Dask workers; the namespaces hang off a bridge in this (the notebook's)
namespace, so the client reaches the scheduler and every worker. Traffic inside a namespace goes
over its loopback (fast); traffic between them leaves each namespace through a veth whose egress
a ``tbf`` queue holds to ``rate`` (its burst ``BURST_MS`` of the rate, at least 64 KiB) — two hosts
with a slow link between them. Needs root, ``ip``,
``tc`` and ``taskset``; ``EmulatedHosts.available()`` says why not where they are missing.

    with EmulatedHosts(rate="1gbit") as hosts:       # or: python -m distlab.bench.emulate
        lab = dl.Lab(address=hosts.scheduler)

Everything is torn down on exit, after a failure too: processes (each in its own session,
killed by group), namespaces (their veth ends go with them) and the bridge. Only the addresses
``10.<net>.0.0/24`` inside these namespaces are used, ``net`` chosen per instance.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from distlab.errors import LaunchError

START_WITHIN = 60.0  # seconds for the scheduler and every worker to come up
# the shaped link's queue, in time at its rate: a shorter one loses packets enough to halve
# TCP's rate (evidence: datasets/measurements/README.md, "Figures behind the code")
QUEUE = "200ms"
# tbf's burst, in time at the rate (64 KiB at most rates): a larger one lets each message after an idle
# link cross at the veth's speed (4 ms hid a 426 KB exchange at 1 Gbit/s: datasets/measurements/README.md,
# trace-whatif); high-resolution timers hold the rate with it (121 MB/s measured at 1 Gbit/s)
BURST_MS = 0.5
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$", re.IGNORECASE)


def rate_bits(rate: str) -> float:
    """``"200mbit"`` -> 2e8 bits per second (tc's units: kbit, mbit, gbit, bit)."""
    m = _RATE.match(rate.strip())
    if not m:
        raise LaunchError(f"rate: {rate!r} is not a tc rate; write e.g. '200mbit' or '1gbit'")
    bits = float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[(m.group(2) or "").lower() or None]
    if bits <= 0:
        raise LaunchError(f"rate: {rate!r} moves nothing; give the link a rate above zero, e.g. '200mbit'")
    return bits


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


class EmulatedHosts:
    """``hosts`` network namespaces, ``workers_per_host`` Dask workers in each, joined at ``rate``.

    ``scheduler``: the address to attach a Lab to; ``addresses``: each host's IP, in order.
    """

    def __init__(
        self, rate: str = "1gbit", hosts: int = 2, workers_per_host: int = 2, burst_ms: float = BURST_MS
    ) -> None:
        """``burst_ms``: the token bucket's burst in time at the rate (at least 64 KiB, one GSO
        packet): what crosses at the veth's own speed after the link idled, which a real link has not."""
        self.burst_ms = float(burst_ms)
        self.rate, self.bits = rate, rate_bits(rate)
        if hosts < 2 or workers_per_host < 1:
            raise LaunchError("EmulatedHosts: needs hosts >= 2 and workers_per_host >= 1")
        self.n_hosts, self.per_host = hosts, workers_per_host
        self.tag = secrets.token_hex(2)  # names unique to this instance (interfaces: <= 15 chars)
        self.net = 100 + int(self.tag, 16) % 150
        self.namespaces = [f"dl{self.tag}h{i}" for i in range(hosts)]
        self.addresses = [f"10.{self.net}.0.{i + 1}" for i in range(hosts)]
        self.bridge = f"dl{self.tag}br"
        self.scheduler = ""
        self.procs: list[subprocess.Popen] = []
        self.workdir = Path(tempfile.mkdtemp(prefix=f"distlab-hosts-{self.tag}-"))
        self._up = False

    # -- can this machine do it ------------------------------------------------------------------
    @staticmethod
    def available() -> str | None:
        """None when this machine can emulate hosts, else why not (for a skip or an error)."""
        if not sys.platform.startswith("linux"):
            return "network namespaces need Linux"
        if os.geteuid() != 0:
            return "network namespaces and tc need root (run as root, or in a container with CAP_NET_ADMIN)"
        for tool in ("ip", "tc", "taskset"):
            if shutil.which(tool) is None:
                return f"'{tool}' is not installed (Debian: apt-get install iproute2 util-linux)"
        probe = f"dlprobe{secrets.token_hex(2)}"
        made = _run("ip", "netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        _run("ip", "netns", "del", probe, check=False)
        return None

    # -- lifetime --------------------------------------------------------------------------------
    def __enter__(self) -> EmulatedHosts:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> EmulatedHosts:
        why = self.available()
        if why:
            raise LaunchError(f"EmulatedHosts: {why}")
        atexit.register(self.close)
        self._up = True
        try:
            self._network()
            self._dask()
        except subprocess.CalledProcessError as exc:
            self.close()
            raise LaunchError(
                f"EmulatedHosts: {' '.join(map(str, exc.cmd))} failed: {(exc.stderr or '').strip()[:200]}"
            ) from None
        except BaseException:
            self.close()
            raise
        return self

    def _network(self) -> None:
        br = self.bridge
        _run("ip", "link", "add", br, "type", "bridge")
        _run("ip", "addr", "add", f"10.{self.net}.0.254/24", "dev", br)
        _run("ip", "link", "set", br, "up")
        burst = max(64 * 1024, int(self.bits / 8 * self.burst_ms / 1e3))
        for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
            inner, outer = f"dl{self.tag}v{i}", f"dl{self.tag}p{i}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "link", "set", outer, "master", br)
            _run("ip", "link", "set", outer, "up")
            for cmd in (
                ("ip", "link", "set", "lo", "up"),
                ("ip", "addr", "add", f"{addr}/24", "dev", inner),
                ("ip", "link", "set", inner, "up"),
                # this host's egress held to the rate: the link between hosts (and to the client)
                (
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    inner,
                    "root",
                    "tbf",
                    "rate",
                    self.rate,
                    "burst",
                    str(burst),
                    "latency",
                    QUEUE,
                ),
            ):
                _run("ip", "netns", "exec", ns, *cmd)

    def _cpus(self, i: int) -> str:
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except AttributeError:
            cpus = list(range(os.cpu_count() or 1))
        share = max(1, len(cpus) // self.n_hosts)
        mine = cpus[i * share : (i + 1) * share] or cpus[-share:]
        return ",".join(map(str, mine))

    def _spawn(self, i: int, *args: str, log: str) -> subprocess.Popen:
        dask = str(Path(sys.executable).with_name("dask"))
        env = {
            **os.environ,
            "DASK_DISTRIBUTED__WORKER__DAEMON": "False",
            "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "30s",
        }
        cmd = ["ip", "netns", "exec", self.namespaces[i], "taskset", "-c", self._cpus(i), dask, *args]
        out = open(self.workdir / log, "w")  # noqa: SIM115 - the process owns it until it ends
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def _dask(self) -> None:
        sched_file = self.workdir / "scheduler.json"
        self._spawn(
            0,
            "scheduler",
            "--host",
            self.addresses[0],
            "--port",
            "0",
            "--no-dashboard",
            "--scheduler-file",
            str(sched_file),
            log="scheduler.log",
        )
        deadline = time.monotonic() + START_WITHIN
        while not sched_file.exists():
            self._check_alive("scheduler", deadline)
            time.sleep(0.2)
        self.scheduler = json.loads(sched_file.read_text())["address"]
        for i, addr in enumerate(self.addresses):
            self._spawn(
                i,
                "worker",
                self.scheduler,
                "--host",
                addr,
                "--nworkers",
                str(self.per_host),
                "--nthreads",
                "1",
                "--no-dashboard",
                "--death-timeout",
                "60",
                log=f"workers-{i}.log",
            )
        from distributed import Client

        with Client(self.scheduler, timeout=START_WITHIN) as client:
            want = self.n_hosts * self.per_host
            while len(client.scheduler_info(n_workers=-1)["workers"]) < want:
                self._check_alive(f"{want} workers", deadline)
                time.sleep(0.3)

    def _check_alive(self, what: str, deadline: float) -> None:
        dead = [p for p in self.procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "; ".join(
                f"{f.name}: {(f.read_text().strip().splitlines() or [''])[-1][:160]}"
                for f in sorted(self.workdir.glob("*.log"))
            )
            cause = "a process exited" if dead else f"not up within {START_WITHIN:g} s"
            raise LaunchError(f"EmulatedHosts: {what} did not start ({cause}); {logs}")

    def close(self) -> None:
        """Kill every process (by group), delete the namespaces and the bridge. Idempotent."""
        if not self._up:
            return
        self._up = False
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)
        for i in range(len(self.namespaces)):  # a veth pair goes with either end: at once, not with
            _run("ip", "link", "del", f"dl{self.tag}p{i}", check=False)  # the namespace's lazy cleanup
        for ns in self.namespaces:
            # anything still inside (a worker's child that left the group) goes with the namespace
            pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "del", ns, check=False)
        _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.close)

    def leftovers(self) -> list[str]:
        """What of this instance still exists (namespaces, links, processes): empty after close()."""
        left = [ns for ns in _run("ip", "netns", "list", check=False).stdout.split() if ns in self.namespaces]
        links = _run("ip", "-o", "link", "show", check=False).stdout
        left += [
            name
            for name in re.findall(r"^\d+: ([^:@]+)", links, re.MULTILINE)
            if name.startswith(f"dl{self.tag}")
        ]
        left += [f"pid {p.pid}" for p in self.procs if p.poll() is None]
        return left


def main(argv: list[str] | None = None) -> int:
    """``python -m distlab.bench.emulate [--rate 1gbit] [--hosts 2] [--workers-per-host 2]``:
    start the emulated hosts, print the scheduler address, hold them until Ctrl-C."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m distlab.bench.emulate", description=main.__doc__)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--workers-per-host", type=int, default=2)
    a = p.parse_args(argv)
    try:
        with EmulatedHosts(a.rate, a.hosts, a.workers_per_host) as hosts:
            print(f"{a.hosts} hosts {', '.join(hosts.addresses)} at {a.rate}; scheduler {hosts.scheduler}")
            print(f"attach with: lab = dl.Lab(address={hosts.scheduler!r})   (Ctrl-C tears it all down)")
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
    except LaunchError as exc:
        print(f"distlab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
