"""``%distlab cluster slurm N``'s start: the notebook's Lab on Slurm jobs, its errors in the magic's words."""

from __future__ import annotations

import re
from typing import Any

from distlab.errors import DistlabError, LaunchError

# a Slurm Lab's argument in its error: "partition='gpu'", "cores=", "cores must be ..."
_LAB_OPTION = re.compile(r"(?<![\w-])(partition|walltime|memory|cores|gpus)(?:=([\w'\"]?)|(?= must be))")


def _as_option(match: re.Match[str]) -> str:
    """A Lab argument in an error (``partition='gpu'``) as the magic's option (``--partition 'gpu'``)."""
    return f"--{match[1]}" + (f" {match[2]}" if match[2] else "")


def start_slurm_lab(session: Any, n: int, options: dict[str, Any]) -> Any:
    """A Lab on ``n`` Slurm jobs (``options``: the magic's partition, walltime, memory, gpus, cores;
    None: the Lab's default) made ``session``'s, then the old Lab stopped: a failed start keeps it,
    as ``session.start_lab`` does for the others; the stop button cancels the new jobs."""
    from distlab.cluster.interrupts import interrupts_held
    from distlab.cluster.slurm import WHO
    from distlab.lab import Lab

    names = {"gpus": "gpus_per_worker"}  # the Lab's names for the options
    given = {names.get(k, k): v for k, v in options.items() if v is not None}
    kept = "; the previous cluster is still running" if session.current_lab is not None else ""
    with interrupts_held(reraise=False) as pressed:
        try:
            lab = Lab(cluster="slurm", workers=n, **given)
        except DistlabError as exc:
            # the Lab's words name its arguments (partition=); here they are the magic's options
            text = str(exc).replace(WHO, "%distlab cluster slurm").replace("gpus_per_worker", "gpus")
            raise LaunchError(_LAB_OPTION.sub(_as_option, text) + kept) from None
        if pressed:
            lab.close()
            raise KeyboardInterrupt
        lab.via_magics = True
        if session.current_lab is not None:
            session.stop_lab()  # keeps its runs in the notebook's history
        session.current_lab = lab
    return lab
