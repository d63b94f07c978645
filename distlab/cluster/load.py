"""Whether the cores were the cluster's own: CPU time other programs used on each host while distlab measured.

A measurement taken while other programs compete for the cores (a build, a browser, another
notebook's training) describes that moment, not the cluster (datasets/measurements/README.md,
"Figures behind the code", says how far off). ``LoadMonitor`` reads each host's CPU
accounting (``/proc/stat``) and the CPU time of the cluster's own processes (the Dask workers,
their nannies and children, the scheduler, and the notebook's process when it shares the host)
at the start and the end of a measurement; what the host's cores spent on anything else is the
foreign load. Where ``/proc`` is not readable (not Linux), nothing is known and nothing is flagged.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from distlab.errors import DistlabWarning
from distlab.resources import available_cores, disturbed_by


class CalibrationWarning(DistlabWarning):
    """A calibration measured under load from other programs: used for this session, not cached."""


@dataclass(frozen=True)
class HostLoad:
    """CPU use of one host over a measurement: ``foreign`` cores busy with other programs on average."""

    host: str
    cores: int
    seconds: float
    foreign: float
    ours: float
    top: tuple[tuple[int, str, float], ...] = ()  # (pid, command, cores) of the busiest other programs

    @property
    def disturbed(self) -> bool:
        return disturbed_by(self.foreign, self.cores)

    def describe(self) -> str:
        who = ", ".join(f"{cmd} (pid {pid}, {cores:.1f} cores)" for pid, cmd, cores in self.top[:3])
        return f"other programs used {self.foreign:.1f} of host {self.host}'s {self.cores} cores" + (
            f": {who}" if who else ""
        )


def _proc_ticks(pid: int) -> tuple[int, int, str, int] | None:
    """(parent pid, utime + stime ticks, command, its reaped children's ticks) of a process, or None when it
    is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    name = raw[raw.find("(") + 1 : raw.rfind(")")]
    rest = raw[raw.rfind(")") + 2 :].split()
    # ppid, utime + stime, and cutime + cstime (fields 4, 14-17): a child that ran and exited
    # between two samples (a native TensorFlow rank) shows only in its parent's cutime
    return int(rest[1]), int(rest[11]) + int(rest[12]), name, int(rest[13]) + int(rest[14])


def host_sample(roots: Iterable[int], alone: Iterable[int] = ()) -> dict[str, Any]:
    """(worker) This host's CPU ticks, and each process's, split into ours (``roots`` and their
    descendants, and ``alone`` without theirs) and everyone else's. Cheap: one read of
    ``/proc`` per process."""
    import socket

    with open("/proc/stat") as f:
        lines = f.read().splitlines()
    # user nice system idle iowait irq softirq steal, then guest and guest_nice: a host's virtual
    # machines' time, which the kernel counts in user and nice already (proc(5))
    fields = [int(x) for x in lines[0].split()[1:9]]
    cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit()) or 1
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    procs = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            got = _proc_ticks(int(entry))
            if got is not None:
                procs[int(entry)] = got
    ours = {int(r) for r in roots if int(r) in procs}
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in procs.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(ours)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in ours:
                ours.add(child)
                todo.append(child)
    family = set(ours)  # whose reaped children are ours too
    ours |= {int(p) for p in alone if int(p) in procs}
    cores = available_cores()
    return {
        "host": socket.gethostname(),
        "time": time.monotonic(),
        "busy": sum(fields) - idle,
        "total": sum(fields),
        "cpus": cpus,
        "cores": cores,
        "ticks": {pid: t for pid, (_, t, _, _) in procs.items()},
        "reaped": {pid: procs[pid][3] for pid in family},
        "parent": {pid: procs[pid][0] for pid in family},
        "names": {pid: name for pid, (_, _, name, _) in procs.items()},
        "ours": sorted(ours),
    }


def _pid_info() -> tuple[str, int, int]:
    import socket

    return socket.gethostname(), os.getpid(), os.getppid()


def host_load(before: dict[str, Any], after: dict[str, Any]) -> HostLoad:
    """The foreign load between two samples of one host (``host_sample``)."""
    total = max(after["total"] - before["total"], 1)
    cpus = after["cpus"]
    seconds = max(after["time"] - before["time"], 1e-9)
    ours = set(before["ours"]) | set(after["ours"])
    # a process that started between the samples spent all its ticks in between: a worker that
    # replaced a lost one, a native TensorFlow rank still running (a pid reused meanwhile: 0)
    delta = {pid: max(t - before["ticks"].get(pid, 0), 0) for pid, t in after["ticks"].items()}
    busy = after["busy"] - before["busy"]
    own = sum(d for pid, d in delta.items() if pid in ours)
    own += sum(t - before.get("reaped", {}).get(pid, t) for pid, t in after.get("reaped", {}).items())
    # a process of ours that died in between was reaped with all its ticks, those before the first
    # sample too: a worker's spare TensorFlow process, started minutes before and ended by this
    # measurement's rank, brought its import's seconds and hid two busy processes from a calibration
    for pid, ppid in before.get("parent", {}).items():
        if pid not in after["ticks"] and ppid in after.get("reaped", {}):
            own -= before["ticks"].get(pid, 0) + before["reaped"].get(pid, 0)
    # ticks are per CPU: a busy share of all CPUs' ticks times the CPUs is cores in use
    per_core = cpus / total
    foreign = max(busy - own, 0) * per_core
    others = sorted(((d, pid) for pid, d in delta.items() if pid not in ours and d > 0), reverse=True)
    top = tuple(
        (pid, after["names"].get(pid, "?"), d * per_core) for d, pid in others[:3] if d * per_core >= 0.05
    )
    return HostLoad(after["host"], int(after["cores"]), seconds, foreign, own * per_core, top)


class LoadMonitor:
    """Foreign CPU load on every host of a Dask cluster between ``start()`` and ``stop()``.

    Samples run through ``client.run`` on one worker per host (a read of ``/proc``, milliseconds),
    so a remote cluster's hosts are watched where they are. ``stop()`` returns one ``HostLoad``
    per host, empty when the hosts cannot be read.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._probe: dict[str, str] = {}  # host -> the worker that samples it
        self._roots: dict[str, list[int]] = {}
        self._alone: dict[str, list[int]] = {}
        self._before: dict[str, dict[str, Any]] = {}

    def start(self) -> LoadMonitor:
        import socket

        try:
            self._add_workers()
        except Exception:  # noqa: BLE001 - a cluster that cannot tell: nothing is flagged
            return self
        here = socket.gethostname()
        if here in self._roots:  # the notebook's process (and an embedded scheduler) share this host;
            self._alone[here].append(os.getpid())  # its other children (the user's programs) are not ours
        try:  # a scheduler of its own process (`dask scheduler` beside the workers) is the cluster's too
            host, pid, _ = self.client.run_on_scheduler(_pid_info)
            if host in self._roots:
                self._alone[host].append(pid)
        except Exception:  # noqa: BLE001 - a scheduler that cannot tell is not counted
            pass
        self._before = self._sample()
        return self

    def _add_workers(self) -> None:
        """The workers' processes now: each one's own and what it starts (DataLoader workers, a
        native rank), and its nanny's process alone (it may be the notebook's)."""
        info = self.client.run(_pid_info)
        for addr, (host, pid, ppid) in sorted(info.items()):
            if self._probe.get(host) not in info:  # a host's first worker samples it, a live one
                self._probe[host] = addr
            if pid not in self._roots.setdefault(host, []):
                self._roots[host].append(pid)
            if ppid not in self._alone.setdefault(host, []):
                self._alone[host].append(ppid)

    def _sample(self) -> dict[str, dict[str, Any]]:
        out = {}
        for host, addr in self._probe.items():
            try:
                out[host] = self.client.run(
                    host_sample, self._roots[host], self._alone.get(host, []), workers=[addr]
                )[addr]
            except Exception:  # noqa: BLE001 - no /proc there (not Linux) or the worker is gone
                continue
        return out

    def stop(self) -> list[HostLoad]:
        try:  # a worker that (re)started meanwhile is the notebook's child, not a worker's: ask again
            self._add_workers()
        except Exception:  # noqa: BLE001 - the workers known at the start are counted
            pass
        after = self._sample()
        return [host_load(self._before[h], after[h]) for h in after if h in self._before]


def warn_disturbed(what: str, loads: list[HostLoad], consequence: str) -> bool:
    """Warn once (a ``CalibrationWarning`` line) when any host was disturbed; True if one was."""
    bad = [h for h in loads if h.disturbed]
    if bad:
        warnings.warn(
            f"{what}: {'; '.join(h.describe() for h in bad)}; {consequence}", CalibrationWarning, stacklevel=3
        )
    return bool(bad)


def warn_if_workers_changed(before: Any, after: Any) -> None:
    """Workers that joined or left while the calibration ran: its figures describe the cluster as
    it was when it started (and are cached for that set), not the one the Lab has now."""
    joined = sorted(set(after.addresses) - set(before.addresses))
    left = sorted(set(before.addresses) - set(after.addresses))
    if not joined and not left:
        return
    what = "; ".join(
        part
        for part in (
            f"joined: {', '.join(joined)}" if joined else "",
            f"left: {', '.join(left)}" if left else "",
        )
        if part
    )
    warnings.warn(
        CalibrationWarning(
            f"calibrate: workers changed while it ran ({what}); its figures describe the {before.world} "
            f"workers there when it started, the Lab has {after.world} now: run lab.calibrate() again to "
            "measure them"
        ),
        stacklevel=3,
    )
