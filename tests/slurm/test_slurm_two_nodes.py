"""Two emulated Slurm nodes (slurmd in two network namespaces, ``scripts/slurm.sh two-up``): one
worker job on each, seen as two hosts, and a 2-rank AllReduce across them that trains."""

from __future__ import annotations

import subprocess

import pytest
import torch
from torch import nn

import distlab as dl
from distlab.cluster.slurm import SlurmSpec, squeue_states, start_slurm

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}


def _where(rank: int, world: int, addr: str, port: int) -> tuple[str | None, str]:
    """(rank) The interface its gloo binds to, and its worker's host."""
    from distlab.runtime.process_group import bind_interface, rank_host

    return bind_interface(), rank_host()


def test_a_2_rank_allreduce_trains_across_two_slurm_nodes_in_network_namespaces(two_nodes, tmp_path):
    jobs = start_slurm(
        2, SlurmSpec(memory="1GB", partition="two"), timeout=120, log_dir=tmp_path, progress=False
    )
    try:
        ids = jobs.job_ids
        nodes = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%N"], capture_output=True, text=True, timeout=30
        )
        assert sorted(nodes.stdout.split()) == ["emu0", "emu1"], nodes.stdout  # one job per node
        lab = dl.Lab(client=jobs.client, timeout=60)
        assert lab.resources.hosts == ("10.97.0.1", "10.97.0.2")  # each node a host
        # each rank's gloo binds to its namespace's own interface, the one its peer reaches
        assert sorted(lab.run_ranks(_where)) == [("dlsi0", "10.97.0.1"), ("dlsi1", "10.97.0.2")]
        g = torch.Generator().manual_seed(0)
        y = torch.randint(0, 4, (512,), generator=g)
        x = (torch.randn(4, 8, generator=g) * 3)[y] + torch.randn(512, 8, generator=g)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
        run = lab.launch(
            model, "AllReduce", steps=60, data=(x, y), batch_size=16, optimizer="sgd", lr=0.1, block=True
        )
        assert run.status == "finished" and run.world == 2, run.error
        assert run.losses.iloc[-5:].mean() < 0.5 * run.losses.iloc[:5].mean(), run.losses
        lab.close()
    finally:
        jobs.close()
    assert {j: s for j, (s, _) in squeue_states(ids).items() if s in ACTIVE} == {}  # close cancelled both
