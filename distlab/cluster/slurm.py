"""Dask workers as Slurm jobs (dask-jobqueue's ``SLURMCluster``), one distlab rank per job, for a Lab.

Long because it is one piece: the request (``SlurmSpec``, its job script), and the jobs' life
(submit, wait with squeue's states, heal, close) that reads it.

``start_slurm(workers, ...)`` submits one ``sbatch`` job per worker, waits for them with a bar
(queued, running, joined: read from ``squeue``) and returns a ``SlurmJobs``: its ``client`` is what
a ``Cluster`` attaches to, ``heal()`` submits a job for each worker whose job ended, and
``close()`` cancels every job it submitted and waits until ``squeue`` lists none of them.

What a Slurm worker needs from distlab reaches it through its job script, since dask-jobqueue
forwards none of the notebook's Dask configuration: ``local.WORKER_CONFIG`` (non-daemonic worker
processes, so that ranks may start DataLoader workers; a quiet event loop) as ``DASK_*`` exports.
Each worker registers at the address of its route to the scheduler (Dask's choice without
``interface=``), and a rank binds gloo and NCCL's bootstrap to the interface holding that address
(``runtime/process_group.bind_interface``): peers reach it where the scheduler does.
"""

from __future__ import annotations

import ast
import contextlib
import datetime
import getpass
import json
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distlab.cluster.interrupts import interrupts_held
from distlab.cluster.local import WORKER_CONFIG

# the walltime check at launch, in a file of its own; distlab.cluster.slurm.check_walltime too
from distlab.cluster.slurm_walltime import (  # noqa: F401 - re-exported
    WHO,
    WalltimeWarning,
    check_walltime,
    parse_walltime,
    predicted_run_seconds,
)
from distlab.cluster.spmd import workers_info
from distlab.errors import LaunchError, check_positive
from distlab.files import cache_home


def import_jobqueue() -> Any:
    """``dask_jobqueue``, imported without the SIGINT handler its ``runner`` module installs at import
    (``sys.exit()`` on Ctrl-C: a notebook's stop button would raise SystemExit in the kernel instead of
    KeyboardInterrupt, and distlab's stop-a-run path would never see it). ImportError when missing."""
    import signal
    import sys
    import threading

    if "dask_jobqueue" in sys.modules:
        return sys.modules["dask_jobqueue"]
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    try:
        import dask_jobqueue
        import dask_jobqueue.slurm  # noqa: F401 - imported with the package, under the same guard
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return dask_jobqueue


INSTALL = (
    "install Slurm's support with pip install 'distlab[slurm]' and run where Slurm's commands are, "
    "or start a one-node Slurm on this machine with `make slurm-up`"
)
# squeue's states (JOB STATE CODES in squeue(1)): a job in QUEUED waits for its node, one in ENDED
# has stopped (its worker is gone or never came)
QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
ENDED = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
    "SPECIAL_EXIT",
    "REVOKED",
}
# squeue's reasons for a pending job that no wait will start (REASONS in squeue(1)): its request
# exceeds what its partition, account or QOS allows, or names what does not exist
NEVER = {
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "AccountNotAllowed",
    "QOSNotAllowed",
    "DependencyNeverSatisfied",
}
CLOSE_WITHIN = 20.0  # seconds close() waits for squeue to list none of its jobs (KillWait: 30 s by default)
POLL = 0.5  # seconds between squeue reads while waiting


@dataclass(frozen=True)
class SlurmSpec:
    """One worker job's request: ``cores`` CPUs and ``memory`` (a size, ``"4GB"``) for one rank,
    ``gpus_per_worker`` GPUs as ``--gres=gpu:G``, Slurm's ``partition`` (``-p``), ``account``
    (``-A``) and ``walltime`` (``-t``; None: the partition's default limit), ``job_extra``: more
    ``#SBATCH`` directives (``"--constraint=a100"``), ``interface``: the network interface the
    workers and the scheduler use (None: each worker's route to the scheduler)."""

    cores: int = 1
    memory: str = "4GB"
    gpus_per_worker: int = 0
    partition: str | None = None
    account: str | None = None
    walltime: str | None = None
    job_extra: tuple[str, ...] = ()
    interface: str | None = None

    def __post_init__(self) -> None:
        from dask.utils import parse_bytes

        check_positive(f"{WHO}: cores", self.cores, LaunchError)
        gpus = self.gpus_per_worker
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise LaunchError(f"{WHO}: gpus_per_worker must be an integer >= 0, got {gpus!r}")
        try:
            parse_bytes(self.memory)
        except (ValueError, TypeError):
            raise LaunchError(
                f"{WHO}: memory={self.memory!r} is not a size; give one like '4GB' (per worker)"
            ) from None
        if isinstance(self.job_extra, str):
            raise LaunchError(f"{WHO}: job_extra must be a list of directives, e.g. ['--constraint=a100']")

    def cluster_kwargs(self, log_dir: Path) -> dict[str, Any]:
        """``SLURMCluster``'s arguments for these jobs: one single-threaded worker per job, the
        worker settings distlab needs exported in the job script, logs in ``log_dir``."""
        directives = [*([f"--gres=gpu:{self.gpus_per_worker}"] if self.gpus_per_worker else [])]
        directives += [str(d).removeprefix("#SBATCH").strip() for d in self.job_extra]
        return {
            "cores": self.cores,
            "processes": 1,  # one worker per job, one rank per worker
            "memory": self.memory,
            "queue": self.partition,
            "account": self.account,
            "walltime": self.walltime,
            # dask-jobqueue's default walltime is 30 min; without one the partition's limit applies
            # (the trailing space: "-t" alone is inside "--cpus-per-task")
            "job_directives_skip": [] if self.walltime else ["#SBATCH -t "],
            "job_extra_directives": directives,
            "job_script_prologue": worker_exports(WORKER_CONFIG),
            "job_name": "distlab-worker",
            "log_directory": str(log_dir),
            "interface": self.interface,
            # the scheduler serves HTTP (health, metrics) whatever the dashboard: no fixed port 8787
            "scheduler_options": {"dashboard_address": ":0"},
            "n_workers": 0,  # submitted by SlurmJobs.submit, which reads sbatch's refusal
        }


def slurm_spec(
    cluster: str | None,
    *,
    attached: bool = False,
    gpus: bool = False,
    cores: int = 1,
    memory: str = "4GB",
    gpus_per_worker: int = 0,
    partition: str | None = None,
    account: str | None = None,
    walltime: str | None = None,
    job_extra: Iterable[str] = (),
    interface: str | None = None,
) -> SlurmSpec | None:
    """``Lab(cluster=..., cores=..., ...)``'s Slurm request, checked: None without ``cluster``
    (then every job option must be left at its default), a ``SlurmSpec`` for ``"slurm"``, else
    one ``LaunchError``. ``attached``: the Lab was also given ``address=``/``client=``;
    ``gpus``: ``gpus=True`` (the embedded cluster's), which a Slurm Lab asks as ``gpus_per_worker``."""
    options = {
        "cores": cores,
        "memory": memory,
        "gpus_per_worker": gpus_per_worker,
        "partition": partition,
        "account": account,
        "walltime": walltime,
        "job_extra": tuple(job_extra),
        "interface": interface,
    }
    if cluster is None:
        given = [k for k, v in options.items() if v != getattr(SlurmSpec, k)]
        if given:
            named = ", ".join(f"{k}=" for k in given)
            raise LaunchError(
                f"Lab({named}): Slurm job options; give cluster='slurm' with them, or leave them out"
            )
        return None
    if cluster != "slurm":
        raise LaunchError(
            f"Lab: cluster={cluster!r} is not one distlab starts ('slurm'); for a running scheduler give "
            "address= or client="
        )
    if attached:
        raise LaunchError(f"{WHO} starts its own scheduler; give cluster= or address=/client=, not both")
    if gpus:
        raise LaunchError(f"{WHO}: ask for GPUs with gpus_per_worker=G (--gres=gpu:G), not gpus=True")
    return SlurmSpec(**options)


def job_script(spec: SlurmSpec, log_dir: Path, scheduler: str = "tcp://SCHEDULER:PORT") -> str:
    """The script ``sbatch`` gets for one worker of ``spec`` (its ``#SBATCH`` lines, the exports,
    the worker command), as dask-jobqueue writes it; no Slurm needed."""
    SLURMJob = import_jobqueue().slurm.SLURMJob  # noqa: N806 - dask-jobqueue's class

    cluster_only = ("n_workers", "scheduler_options")
    kwargs = {k: v for k, v in spec.cluster_kwargs(log_dir).items() if k not in cluster_only}
    return str(SLURMJob(scheduler, name="distlab-worker-0", **kwargs).job_script())


def worker_exports(config: Mapping[str, Any]) -> list[str]:
    """``config`` (``{"distributed.worker.daemon": False, ...}``) as the shell lines that give it to
    a Dask worker through its environment: ``export DASK_DISTRIBUTED__WORKER__DAEMON=False``.
    Dask reads each value back with ``ast.literal_eval`` (a string that is no literal stays one)."""
    lines = []
    for key, value in config.items():
        name = "DASK_" + "__".join(part.upper().replace("-", "_") for part in key.split("."))
        text = value if isinstance(value, str) else repr(value)
        if isinstance(value, dict) and ast.literal_eval(json.dumps(value)) == value:
            text = json.dumps(value)  # double quotes: one clean single-quoted shell word
        lines.append(f"export {name}={shlex.quote(text)}")
    return lines


def check_slurm_commands() -> None:
    """One ``LaunchError`` naming the extra and ``make slurm-up`` when dask-jobqueue or Slurm's
    commands (``sbatch``, ``squeue``, ``scancel``) are missing here."""
    try:
        import_jobqueue()
    except ImportError:
        raise LaunchError(f"{WHO}: dask-jobqueue is not installed; {INSTALL}") from None
    missing = [c for c in ("sbatch", "squeue", "scancel") if shutil.which(c) is None]
    if missing:
        raise LaunchError(f"{WHO}: no `{missing[0]}` on this machine's PATH; {INSTALL}")


def check_interface(interface: str | None) -> None:
    """The scheduler listens on ``interface`` here too (dask-jobqueue uses it for both): one
    ``LaunchError`` listing this machine's interfaces when it has no such one."""
    if interface is None:
        return
    import psutil

    names = sorted(psutil.net_if_addrs())
    if interface not in names:
        raise LaunchError(
            f"{WHO}: interface={interface!r} is not one of this machine's ({', '.join(names)}); the "
            "scheduler here and the workers use it: give one both have, or leave it out"
        )


def squeue_states(job_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """``{job id: (state, reason)}`` of those of ``job_ids`` squeue still knows (recently ended
    ones too, in their end state: ``-t all``)."""
    ids = {str(j) for j in job_ids}
    if not ids:
        return {}
    done = subprocess.run(
        ["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-o", "%i|%T|%r"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    states = {}
    for line in done.stdout.splitlines():
        job, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job in ids:
            states[job] = (state, reason)
    return states


def slurm_message(exc: BaseException) -> str:
    """Slurm's own words from a failed ``sbatch`` (dask-jobqueue's RuntimeError holds its stderr):
    its first ``sbatch: error:`` line, else the last line of the error."""
    text = str(exc)
    for line in text.splitlines():
        if "error:" in line:
            return line.split("error:", 1)[1].strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


class SlurmJobs:
    """The Slurm jobs of one Lab: a ``SLURMCluster`` (its scheduler in this process) and its client.

    ``submitted`` holds every job id it ever submitted (replacements too): ``close()`` cancels
    those still queued or running."""

    def __init__(self, spec: SlurmSpec, log_dir: Path) -> None:
        from distributed import Client

        SLURMCluster = import_jobqueue().SLURMCluster  # noqa: N806 - dask-jobqueue's class

        self.spec = spec
        self.log_dir = log_dir
        self.submitted: list[str] = []
        self.target = 0  # the workers it keeps: submit(n)'s n
        self.names: set[str] = set()  # every worker name it gave a job: a replacement gets a new one
        # heal from the Lab (a launch, the magics) and from the replacing thread: one at a time
        self.lock = threading.RLock()
        self.keeper: Any = None  # keep_workers' thread
        self.cluster: Any = SLURMCluster(**spec.cluster_kwargs(log_dir))
        self.client: Any = Client(self.cluster)

    @property
    def job_ids(self) -> list[str]:
        """The jobs of the workers it has now (submitted, not yet found ended)."""
        return [str(job.job_id) for job in self.cluster.workers.values() if getattr(job, "job_id", None)]

    def workers_of_jobs(self) -> dict[str, str | None]:
        """``{job id: its worker's address}`` (None: not joined yet)."""
        by_name = {str(w.get("name")): addr for addr, w in workers_info(self.client).items()}
        return {
            str(job.job_id): by_name.get(str(name))
            for name, job in self.cluster.workers.items()
            if getattr(job, "job_id", None)
        }

    def submit(self, n: int) -> None:
        """Have ``n`` worker jobs: submit the missing ones (one ``sbatch`` each). Slurm's refusal
        (a partition that does not exist, a request no node fits) is one ``LaunchError`` in
        Slurm's words."""
        cluster = self.cluster
        self.target = n
        while len(cluster.worker_spec) < n:
            # a name of its own: SpecCluster closes the job under a lost worker's name once
            # lost-worker-timeout (15 s) passed, and would cancel a replacement still queued under it
            spec = cluster.new_worker_spec()
            while (name := str(next(iter(spec)))) in self.names:
                cluster._i += (
                    1  # dask's counter of names: new_worker_spec reuses a name no longer in its spec
                )
                spec = cluster.new_worker_spec()
            self.names.add(name)
            cluster.worker_spec.update(spec)
        try:
            cluster.sync(cluster._correct_state)
        except Exception as exc:  # noqa: BLE001 - sbatch's exit, as dask-jobqueue's RuntimeError
            self._note_submitted()
            from distributed.core import Status

            # the refused job never started: SpecCluster's close asserts every job it made did, and
            # stops short of marking itself closed (an "unclosed cluster" warning at exit)
            for job in list(cluster._created):
                if job.status == Status.created:
                    job.status = Status.failed
            raise LaunchError(
                f"{WHO}: Slurm refused the worker job: {slurm_message(exc)}{self._hint()}"
            ) from None
        self._note_submitted()

    def _note_submitted(self) -> None:
        self.submitted += [j for j in self.job_ids if j not in self.submitted]

    def _hint(self) -> str:
        """What to try after a refusal: the partitions there are, when one was named."""
        if self.spec.partition is None:
            return ""
        done = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30)
        names = sorted({p.strip() for p in done.stdout.split()})  # sinfo marks the default one with '*'
        listed = ", ".join(p.rstrip("*") + (" (the default)" if p.endswith("*") else "") for p in names)
        return f" (partition={self.spec.partition!r}; sinfo lists {listed or 'none'})"

    def counts(self) -> tuple[int, int, int, dict[str, tuple[str, str]]]:
        """(queued, running, joined) worker jobs now, and squeue's view of them."""
        jobs = self.workers_of_jobs()
        states = squeue_states(jobs)
        joined = sum(1 for addr in jobs.values() if addr is not None)
        queued = sum(1 for j, a in jobs.items() if a is None and states.get(j, ("",))[0] in QUEUED)
        running = sum(1 for j, a in jobs.items() if a is None and states.get(j, ("",))[0] == "RUNNING")
        return queued, running, joined, states

    def wait(self, n: int, timeout: float, progress: bool = True) -> None:
        """Until ``n`` workers joined, with a bar (queued, running, joined) shown after a second.
        A job that ended before its worker joined is a ``LaunchError`` quoting its log's last
        line; ``timeout`` seconds without ``n`` one naming the jobs still waiting and their
        Slurm states (squeue's reason)."""
        bar = _bar(n, progress)
        deadline = time.monotonic() + timeout
        try:
            while True:
                queued, running, joined, states = self.counts()
                if bar is not None:  # update() shows it once it lasted tqdm's delay; refresh() would not wait
                    bar.set_postfix_str(f"queued {queued}, running {running}, joined {joined}", refresh=False)
                    bar.update(joined - bar.n)
                if joined >= n:
                    return
                self._check_ended(states)
                if time.monotonic() > deadline:
                    raise LaunchError(self._late(n, joined, timeout, states))
                time.sleep(POLL)
        finally:
            if bar is not None:
                bar.close()

    def _check_ended(self, states: dict[str, tuple[str, str]]) -> None:
        """A job that ended before its worker joined, or that Slurm will never start, is an error now."""
        for job, addr in self.workers_of_jobs().items():
            state, reason = states.get(job, ("", ""))
            if addr is None and state in QUEUED and reason in NEVER:
                raise LaunchError(
                    f"{WHO}: Slurm will not start worker job {job}: {state} ({reason}), its request exceeds "
                    "what the partition, account or QOS allows; ask for fewer cores= or less memory=, "
                    "or another partition= (sinfo -o '%P %c %m %l' lists them)"
                )
            if addr is None and state in ENDED:
                raise LaunchError(
                    f"{WHO}: worker job {job} ended ({state}) before its worker joined; {self._log_tail(job)}"
                )

    def _log_tail(self, job: str) -> str:
        logs = sorted(self.log_dir.glob(f"*-{job}.err")) + sorted(self.log_dir.glob(f"*-{job}.out"))
        for log in logs:
            lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
            if lines:
                return f"its log {log} ends: {lines[-1][:200]}"
        return f"its log in {self.log_dir} is empty (sacct -j {job} may say more)"

    def _late(self, n: int, joined: int, timeout: float, states: dict[str, tuple[str, str]]) -> str:
        waiting = [j for j, a in self.workers_of_jobs().items() if a is None]
        named = ", ".join(
            f"{j} {states[j][0]}" + (f" ({states[j][1]})" if states[j][1] not in ("", "None") else "")
            if j in states
            else f"{j} (not in squeue)"
            for j in waiting
        )
        return (
            f"{WHO}: {joined} of {n} workers joined within {timeout:g} s; waiting: {named or 'none'}; "
            "give a longer timeout=, fewer workers, or another partition="
        )

    @property
    def lost(self) -> int:
        """How many of its workers are not in the cluster now (their jobs ended, or still queued)."""
        joined = sum(1 for a in self.workers_of_jobs().values() if a is not None)
        return max(0, self.target - joined)

    def lost_text(self, lost: int) -> str:
        """These jobs with ``lost`` workers gone, in a line: how many, what submits new ones."""
        n = self.target
        return (
            f"{n - lost} of {n} Slurm workers running ({lost} gone: lab.heal() or the next launch submits "
            "new jobs)"
        )

    def heal(self, within: float, progress: bool = False) -> int:
        """Submit a job for each worker whose job ended (cancelled, timed out, failed) and wait up
        to ``within`` seconds for them to join; returns how many were replaced."""
        with self.lock:
            cluster = self.cluster
            jobs = self.workers_of_jobs()
            states = squeue_states(jobs)
            # a job squeue no longer lists (past MinJobAge) ended too: sbatch returns once it is listed
            ended = {
                j for j, addr in jobs.items() if addr is None and states.get(j, ("COMPLETED",))[0] in ENDED
            }
            # SpecCluster keeps a job whose worker left until lost-worker-timeout, then drops it but
            # keeps its name in worker_spec; either way the name is retired and a new job submitted
            gone = [n for n, job in cluster.workers.items() if str(getattr(job, "job_id", "")) in ended]
            gone += [n for n in cluster.worker_spec if n not in cluster.workers]
            if not gone:
                return 0
            for name in gone:
                cluster.workers.pop(name, None)
                cluster.worker_spec.pop(name, None)
            self.submit(self.target)
            self.wait(self.target, within, progress)
            return len(gone)

    def started_at(self) -> float | None:
        """When the earliest of its running jobs started (seconds since the epoch, squeue's START_TIME):
        the one whose walltime ends first. None when none runs."""
        ids = set(self.job_ids)
        if not ids:
            return None
        done = subprocess.run(
            ["squeue", "-h", "-u", getpass.getuser(), "-t", "RUNNING", "-o", "%i|%S"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        starts = []
        for line in done.stdout.split():
            job, _, start = line.partition("|")
            if job in ids:
                with contextlib.suppress(ValueError):  # "N/A" for a job not started
                    starts.append(datetime.datetime.fromisoformat(start).timestamp())  # local time, as squeue
        return min(starts, default=None)

    def keep_workers(
        self, runs: Callable[[], list[Any]], workers: Callable[[], list[str]], within: float
    ) -> Any:
        """Replace each worker whose job ends, and grow the runs that lost it back onto the new one
        (``slurm_replace.WorkerKeeper``, a thread until ``close``): ``runs()`` the Lab's runs,
        ``workers()`` its worker addresses in rank order, ``within`` seconds for a join or a pause."""
        from distlab.cluster.slurm_replace import WorkerKeeper

        if self.keeper is None:
            self.keeper = WorkerKeeper(self, runs, workers, within=within)
        return self.keeper

    def check_run(self, run: Any) -> str | None:
        """Warn (``WalltimeWarning``) when ``run`` is predicted to outlast what is left of these
        jobs' walltime; its text, or None."""
        seconds = predicted_run_seconds(run.steps, run.predicted_throughput, run.batch_size * run.world)
        return check_walltime(self.spec.walltime, self.started_at(), seconds)

    def close(self) -> None:
        """Stop replacing workers, close the client and the cluster (``scancel`` of each worker's
        job), cancel any job it submitted that is still queued or running, and wait until squeue
        lists none (at most ``CLOSE_WITHIN`` seconds: a cancelled job's worker gets Slurm's
        KillWait to exit)."""
        if self.keeper is not None:
            self.keeper.close()
        with interrupts_held(reraise=False):
            with contextlib.suppress(Exception):
                self.client.close()
            with contextlib.suppress(Exception):
                self.cluster.close()
            left = self.active()
            if left:
                subprocess.run(["scancel", *left], capture_output=True, timeout=30)
            deadline = time.monotonic() + CLOSE_WITHIN
            while left and time.monotonic() < deadline:
                time.sleep(0.2)
                left = [j for j, (state, _) in squeue_states(left).items() if state not in ENDED]

    def active(self) -> list[str]:
        """The submitted jobs squeue lists as not ended (queued, running or completing)."""
        return [j for j, (state, _) in squeue_states(self.submitted).items() if state not in ENDED]


def _bar(total: int, enabled: bool) -> Any:
    """The wait's bar, shown once it lasted a second (tqdm's ``delay``)."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Slurm workers", unit="worker", delay=1.0, leave=False)


def start_slurm(
    workers: int | None,
    spec: SlurmSpec | None = None,
    *,
    timeout: float = 60,
    log_dir: str | Path | None = None,
    progress: bool = True,
) -> SlurmJobs:
    """Submit ``workers`` Slurm jobs of ``spec`` and wait up to ``timeout`` seconds for their
    workers to join; on any failure (Ctrl-C too) every job submitted is cancelled first. Logs go
    to ``log_dir`` (default ``slurm`` in ``files.cache_home()``, ``~/.cache/distlab/slurm``: on a
    cluster it must be a folder the compute nodes can write, as a home folder is)."""
    if workers is None:
        raise LaunchError(f"{WHO}: give workers=N, the number of worker jobs (one rank each) to submit")
    check_positive(f"{WHO}: workers", workers, LaunchError)
    spec = spec or SlurmSpec()
    check_slurm_commands()
    check_interface(spec.interface)
    folder = Path(log_dir) if log_dir else cache_home() / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    jobs = SlurmJobs(spec, folder)
    try:
        jobs.submit(workers)
        jobs.wait(workers, timeout, progress)
    except BaseException:
        jobs.close()
        raise
    return jobs
