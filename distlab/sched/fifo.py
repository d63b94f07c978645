"""First in, first out: each job gets the workers it asks for (``max_replicas``) in arrival order.

The baseline a shared cluster has without a goodput scheduler: no job is resized or preempted, and
a job that does not fit blocks those behind it (no backfilling), as a plain queue does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from distlab.sched.policy import Allocated, JobSpec, Layout, job_names, name_strategies, place


@dataclass(frozen=True)
class FifoPolicy:
    """The ``"fifo"`` policy: running jobs keep their workers; waiting jobs start in arrival order."""

    def allocate(
        self,
        jobs: Sequence[JobSpec],
        workers: Mapping[str, str] | Sequence[str],
        previous: Mapping[str, Sequence[str]],
    ) -> Allocated:
        layout = Layout.of(workers)
        jobs = sorted(jobs, key=lambda j: (j.submitted, j.name))
        names = job_names(jobs)
        counts = layout.counts(previous, names)
        free = layout.capacity - counts.sum(axis=0)
        shared = (counts * (np.count_nonzero(counts, axis=1) > 1)[:, None]).sum(axis=0) > 0
        for j, job in enumerate(jobs):
            if counts[j].any():
                continue
            want = int(min(job.max_replicas, layout.capacity.sum()))
            spot = place(want, free, shared, layout.hosts_known)
            if spot is None:
                break  # the head of the queue waits, and so does everyone behind it
            counts[j] = spot
            free -= spot
            if np.count_nonzero(spot) > 1:
                shared |= spot > 0
        return name_strategies(layout.to_workers(counts, names, previous), jobs, workers, previous)
