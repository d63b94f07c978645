"""What a Lab on Slurm asks of Slurm, read from the job script, and the errors that need no Slurm."""

from __future__ import annotations

import pytest

from distlab.cluster.local import WORKER_CONFIG
from distlab.cluster.slurm import (
    SlurmSpec,
    import_jobqueue,
    job_script,
    slurm_spec,
    start_slurm,
    worker_exports,
)
from distlab.errors import LaunchError

try:  # through distlab's import: dask-jobqueue's own replaces this process's SIGINT handler
    import_jobqueue()
except ImportError:
    pytest.skip("dask-jobqueue is not installed (pip install 'distlab[slurm]')", allow_module_level=True)


def _directives(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ").strip() for line in script.splitlines() if line.startswith("#SBATCH")
    ]


def test_the_job_asks_for_the_gpus_partition_account_walltime_and_extra_directives(tmp_path):
    spec = SlurmSpec(
        cores=4,
        memory="16GB",
        gpus_per_worker=2,
        partition="gpu",
        account="proj1",
        walltime="02:00:00",
        job_extra=("--constraint=a100", "#SBATCH --exclusive"),
    )
    lines = _directives(job_script(spec, tmp_path))
    for wanted in ("-p gpu", "-A proj1", "-t 02:00:00", "--gres=gpu:2", "--cpus-per-task=4", "--mem=15G"):
        assert wanted in lines, lines
    assert "--constraint=a100" in lines and "--exclusive" in lines
    assert any(line.startswith("-o ") and str(tmp_path) in line for line in lines)  # logs where asked


def test_without_gpus_or_walltime_the_job_asks_for_neither():
    lines = _directives(job_script(SlurmSpec(), __import__("pathlib").Path("/tmp")))
    assert not any("gres" in line for line in lines)
    # no "-t": the partition's own limit, not dask-jobqueue's 30 minutes
    assert not any(line.startswith("-t") for line in lines) and "--cpus-per-task=1" in lines


def test_the_worker_settings_distlab_needs_reach_dask_through_the_job_scripts_exports():
    import shlex

    import dask
    from dask.config import collect_env

    env = {}
    for line in worker_exports(WORKER_CONFIG):
        name, _, value = line.removeprefix("export ").partition("=")
        env[name] = shlex.split(value)[0]
    got = collect_env(env)
    for key, value in WORKER_CONFIG.items():  # daemon=False among them: ranks may start DataLoader workers
        assert dask.config.get(key, config=got) == value, key


def test_no_sbatch_here_is_one_line_naming_the_extra_and_make_slurm_up(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing of Slurm's on it
    with pytest.raises(LaunchError) as err:
        start_slurm(2)
    text = str(err.value)
    assert "no `sbatch`" in text and "distlab[slurm]" in text and "make slurm-up" in text
    assert "\n" not in text


@pytest.mark.parametrize(
    "options, field",
    [({"memory": "lots"}, "memory="), ({"gpus_per_worker": -1}, "gpus_per_worker"), ({"cores": 0}, "cores")],
)
def test_a_bad_request_names_its_field(options, field):
    with pytest.raises(LaunchError, match=field):
        SlurmSpec(**options)


@pytest.mark.parametrize(
    "cluster, options, words",
    [
        (
            None,
            {"cores": 4, "partition": "gpu"},
            "Lab(cores=, partition=): Slurm job options; give cluster='slurm'",
        ),
        ("pbs", {}, "cluster='pbs' is not one distlab starts"),
        ("slurm", {"attached": True}, "give cluster= or address=/client=, not both"),
        ("slurm", {"gpus": True}, "gpus_per_worker=G"),
    ],
)
def test_the_labs_slurm_options_out_of_place_are_one_line_saying_what_to_give(cluster, options, words):
    with pytest.raises(LaunchError) as err:
        slurm_spec(cluster, **options)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_labs_slurm_options_make_the_jobs_request():
    assert slurm_spec(None) is None  # the embedded cluster
    spec = slurm_spec("slurm", cores=2, gpus_per_worker=1, job_extra=["--constraint=a100"])
    assert spec == SlurmSpec(cores=2, gpus_per_worker=1, job_extra=("--constraint=a100",))


def test_a_slurm_lab_without_a_worker_count_says_to_give_one():
    with pytest.raises(LaunchError, match="give workers=N"):
        start_slurm(None)


def test_an_interface_this_machine_lacks_is_one_line_listing_its_own(monkeypatch):
    from distlab.cluster import slurm

    monkeypatch.setattr(
        slurm, "check_slurm_commands", lambda: None
    )  # the interface is checked before any job
    with pytest.raises(LaunchError, match=r"interface='nope0' is not one of this machine's \(.*lo") as err:
        start_slurm(1, SlurmSpec(interface="nope0"))
    assert "\n" not in str(err.value)


def test_importing_dask_jobqueue_through_distlab_keeps_the_kernels_sigint_handler():
    """dask-jobqueue's runner module sets SIGINT to ``sys.exit()`` at import: in a kernel the stop
    button then raised SystemExit, and distlab's stop path (KeyboardInterrupt) never ran."""
    import subprocess
    import sys

    code = (
        "import signal\n"
        "def mine(*_): pass\n"
        "signal.signal(signal.SIGINT, mine)\n"
        "from distlab.cluster.slurm import import_jobqueue\n"
        "import_jobqueue()\n"
        "print(signal.getsignal(signal.SIGINT) is mine)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-1:] == ["True"], out.stderr[-1000:]
