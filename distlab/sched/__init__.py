"""Several jobs on one cluster: Pollux-style allocation policies and a simulator that replays job arrivals.

The policies are pure (no Dask, no torch): ``policy`` the types a policy sees and the check that
refuses a bad allocation, ``goodput`` Pollux's policy, ``fifo`` the queue baseline, ``speedup`` a
job's speedup per allocation from the cost model (the best strategy for each) and its runs,
``restart`` a restart's measured cost, ``simulate`` the replay loop, ``artifact*`` the Pollux
OSDI'21 artifact's job models and traces (datasets/pollux-osdi21) that validate the simulator and
policy against the published results. ``lab_cluster``, ``lab_scheduler``, ``lab_adapt`` and
``queue`` run a shared Lab's runs (they drive Runs; the policies they call stay pure).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from distlab.errors import SchedulerError
from distlab.sched.fifo import FifoPolicy
from distlab.sched.goodput import GoodputPolicy
from distlab.sched.policy import Allocated, Allocation, JobSpec, Policy, check_allocation
from distlab.sched.simulate import SimCluster, SimJob, SimResult, WorkJob, simulate

POLICIES = {"goodput": GoodputPolicy, "fifo": FifoPolicy}


def get_policy(policy: Policy | str) -> Policy:
    """A Policy from its name (``"goodput"``, ``"fifo"``) or a user's object with ``allocate``."""
    if isinstance(policy, str):
        try:
            return POLICIES[policy]()
        except KeyError:
            raise SchedulerError(
                f"scheduler={policy!r} is not a policy; use one of {sorted(POLICIES)} or an object "
                "with allocate(jobs, workers, previous)"
            ) from None
    if not callable(getattr(policy, "allocate", None)):
        raise SchedulerError(
            f"scheduler={type(policy).__name__} has no allocate(jobs, workers, previous) method; "
            f"implement distlab.sched.Policy or use one of {sorted(POLICIES)}"
        )
    return policy


def allocate(
    jobs: Sequence[JobSpec],
    workers: Mapping[str, str] | Sequence[str],
    previous: Mapping[str, Sequence[str]] | None = None,
    policy: Policy | str = "goodput",
) -> Allocated:
    """One scheduling round: the policy's allocation, checked (a SchedulerError if it is refused)."""
    chosen = get_policy(policy)
    return check_allocation(chosen.allocate(jobs, workers, previous or {}), jobs, workers)


__all__ = [
    "POLICIES",
    "Allocated",
    "Allocation",
    "FifoPolicy",
    "GoodputPolicy",
    "JobSpec",
    "Policy",
    "SchedulerError",
    "SimCluster",
    "SimJob",
    "SimResult",
    "WorkJob",
    "allocate",
    "check_allocation",
    "get_policy",
    "simulate",
]
