"""The one-node Slurm the Slurm tests run against: the machine's own when ``sinfo`` answers, else
started by ``scripts/slurm.sh up`` (root, Debian's packages installed when missing) and stopped
after the session, leaving nothing running; skipped, with the reason, where neither can be had."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm.sh"
CANNOT = 2  # scripts/slurm.sh's exit when Slurm cannot be installed or started here


def _answers() -> bool:
    """A Slurm runs here: sinfo reaches a controller with an idle (or busy) node."""
    if shutil.which("sinfo") is None:
        return False
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and any(s in done.stdout for s in ("idle", "mix", "alloc"))


def _pids(folder: Path) -> dict[str, int]:
    """The daemons scripts/slurm.sh started, by pid file."""
    out = {}
    for name in ("slurmctld", "slurmd", "munged"):
        path = folder / f"{name}.pid"
        if path.exists():
            out[name] = int(path.read_text().split()[0])
    return out


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="session")
def slurm():
    """Slurm's commands reach a controller with a node for the session's tests."""
    from distlab.cluster.slurm import import_jobqueue

    try:
        import_jobqueue()
    except ImportError:
        pytest.skip("dask-jobqueue is not installed (pip install 'distlab[slurm]')")
    if _answers():
        yield "the machine's"
        return
    if os.geteuid() != 0:
        pytest.skip("no Slurm answers here and starting one (make slurm-up) needs root")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("no Slurm answers here, and no slurm-wlm nor apt-get to install it")
    folder = ROOT / ".slurm"
    env = {**os.environ, "SLURM_DIR": str(folder)}
    up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=600, env=env)
    if up.returncode == CANNOT:
        pytest.skip(f"the one-node Slurm cannot start here: {up.stderr.strip().splitlines()[-1]}")
    assert up.returncode == 0, up.stderr
    started = _pids(folder)
    try:
        yield "started by scripts/slurm.sh"
    finally:
        down = subprocess.run(
            ["bash", str(SCRIPT), "down"], capture_output=True, text=True, timeout=120, env=env
        )
        assert down.returncode == 0, down.stderr
        left = {name: pid for name, pid in started.items() if _running(pid)}
        assert not left, f"scripts/slurm.sh down left these running: {left}"


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    """A rank's task names a test module by reference (a task graph is pickled, not cloudpickled):
    sbatch gives the jobs this process's environment, PYTHONPATH too, as a notebook's modules
    reach the workers on a shared file system."""
    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(ROOT), str(here), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)


@pytest.fixture(scope="module")
def two_nodes():
    """Two emulated Slurm nodes (``scripts/slurm.sh two-up``: slurmd in two network namespaces, their
    own controller), Slurm's commands pointed at them through ``SLURM_CONF`` for the module's tests."""
    from distlab.cluster.slurm import import_jobqueue

    try:
        import_jobqueue()
    except ImportError:
        pytest.skip("dask-jobqueue is not installed (pip install 'distlab[slurm]')")
    if os.geteuid() != 0:
        pytest.skip("two emulated Slurm nodes need root (network namespaces, slurmd)")
    env = {**os.environ, "SLURM_DIR": str(ROOT / ".slurm")}
    up = subprocess.run(["bash", str(SCRIPT), "two-up"], capture_output=True, text=True, timeout=600, env=env)
    if up.returncode == CANNOT:
        pytest.skip(f"two emulated Slurm nodes cannot start here: {up.stderr.strip().splitlines()[-1]}")
    assert up.returncode == 0, up.stderr
    conf = up.stdout.strip().splitlines()[-1].removeprefix("SLURM_CONF=")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", conf)
            yield conf
    finally:
        down = subprocess.run(
            ["bash", str(SCRIPT), "two-down"], capture_output=True, text=True, timeout=120, env=env
        )
        assert down.returncode == 0, down.stderr
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "dlslurm" not in left, f"scripts/slurm.sh two-down left namespaces: {left}"
        pids = sorted((ROOT / ".slurm" / "two").glob("*.pid"))
        assert not pids, f"scripts/slurm.sh two-down left these running: {pids}"
