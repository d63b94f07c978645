# ruff: noqa: UP006, UP007, UP035, UP045
"""BlueFog's topology definitions, transcribed to check distlab's against (BlueFog cannot be installed
here: it needs MPI).

Source: Bluefog-Lib/bluefog, ``bluefog/common/topology_util.py`` at commit 9ee376a (9ee376a7f739,
2023-03-27), Copyright 2020 Bluefog Team, licensed under the Apache License, Version 2.0
(http://www.apache.org/licenses/LICENSE-2.0); distributed "AS IS", WITHOUT WARRANTIES OR CONDITIONS
OF ANY KIND. Changes from the original: the functions distlab does not mirror are left out
(IsTopologyEquivalent, which calls networkx's removed ``to_numpy_matrix``, and IsRegularGraph);
docstrings are cut to their first paragraph (the ``.. plot::`` examples are gone); ``ruff format``
re-spaced the code (line breaks, parentheses for backslash continuations). Every statement is as
BlueFog wrote it. The graphs stay ``nx.DiGraph``s; the tests read them as BlueFog's own
``GetRecvWeights`` does, ``nx.to_numpy_array(G)[i, j]`` = the weight of edge i -> j.

Two more pieces are BlueFog's arithmetic rather than its topology module, transcribed as functions:

- ``example_weights``: the weights every BlueFog example gives a dynamic step's receive
  (``examples/pytorch_benchmark.py`` lines 188-192, the same in ``pytorch_mnist.py``,
  ``pytorch_resnet.py``, ``pytorch_average_consensus.py``).
- ``hierarchical_neighbor_allreduce``: what ``bf.hierarchical_neighbor_allreduce`` computes
  (``bluefog/torch/mpi_ops.py`` ``_hierarchical_neighbor_allreduce_nonblocking``, the hierarchical
  branch of ``MPIController::NeighborAllreduce`` in ``bluefog/common/mpi_controller.cc`` and
  ``PerformNeighborAllreduceCallback`` in ``bluefog/torch/mpi_ops.cc``), on one value per rank.
"""

import math
from typing import Dict, Iterator, List, Optional, Tuple

import networkx as nx
import numpy as np


def GetRecvWeights(topo: nx.DiGraph, rank: int) -> Tuple[float, Dict[int, float]]:
    """Return a Tuple of self_weight and neighbor_weights for receiving dictionary."""
    weight_matrix = nx.to_numpy_array(topo)
    self_weight = 0.0
    neighbor_weights = {}
    for src_rank in topo.predecessors(rank):
        if src_rank == rank:
            self_weight = weight_matrix[src_rank, rank]
        else:
            neighbor_weights[src_rank] = weight_matrix[src_rank, rank]
    return self_weight, neighbor_weights


def GetSendWeights(topo: nx.DiGraph, rank: int) -> Tuple[float, Dict[int, float]]:
    """Return a Tuple of self_weight and neighbor_weights for sending dictionary."""
    weight_matrix = nx.to_numpy_array(topo)
    self_weight = 0.0
    neighbor_weights = {}
    for recv_rank in topo.successors(rank):
        if recv_rank == rank:
            self_weight = weight_matrix[rank, recv_rank]
        else:
            neighbor_weights[recv_rank] = weight_matrix[rank, recv_rank]
    return self_weight, neighbor_weights


def ExponentialTwoGraph(size: int) -> nx.DiGraph:
    """Generate graph topology such that each points only
    connected to a point such that the index difference is the power of 2."""
    assert size > 0
    x = np.array([1.0 if i & (i - 1) == 0 else 0 for i in range(size)])
    x /= x.sum()
    topo = np.empty((size, size))
    for i in range(size):
        topo[i] = np.roll(x, i)
    G = nx.from_numpy_array(topo, create_using=nx.DiGraph)
    return G


def isPowerOf(x, base):
    assert isinstance(base, int), "Base has to be a integer."
    assert base > 1, "Base has to a interger larger than 1."
    assert x > 0
    if (base ** int(math.log(x, base))) == x:
        return True
    return False


def ExponentialGraph(size: int, base: int = 2) -> nx.DiGraph:
    """Generate graph topology such that each points only
    connected to a point such that the index difference is power of base. (Default is 2)"""
    x = [1.0]
    for i in range(1, size):
        if isPowerOf(i, base):
            x.append(1.0)
        else:
            x.append(0.0)
    x = np.array(x)
    x /= x.sum()
    topo = np.empty((size, size))
    for i in range(size):
        topo[i] = np.roll(x, i)
    G = nx.from_numpy_array(topo, create_using=nx.DiGraph)
    return G


def SymmetricExponentialGraph(size: int, base: int = 4) -> nx.DiGraph:
    """
    Generate symmeteric graph topology such that for the first half of nodes
    only connected to a point such that the index difference is power of base (Default is 4)
    and the connectivity for the second half of nodes just mirrored to the first half."""
    x = [1.0]
    for i in range(1, size):
        index = i if i <= size // 2 else size - i
        if isPowerOf(index, base):
            x.append(1.0)
        else:
            x.append(0.0)
    x = np.array(x)
    x /= x.sum()
    topo = np.empty((size, size))
    for i in range(size):
        topo[i] = np.roll(x, i)
    G = nx.from_numpy_array(topo, create_using=nx.DiGraph)
    return G


def MeshGrid2DGraph(size: int, shape: Optional[Tuple[int, int]] = None) -> nx.DiGraph:
    """Generate 2D MeshGrid structure of graph.

    Assume shape = (nrow, ncol), when shape is provided, a meshgrid of nrow*ncol will be generated.
    when shape is not provided, nrow and ncol will be the two closest factors of size.

    For example: size = 24, nrow and ncol will be 4 and 6, respectively.
    We assume  nrow will be equal to or smaller than ncol.
    If size is a prime number, nrow will be 1, and ncol will be size, which degrades the topology
    into a linear one."""

    assert size > 0
    if shape is None:
        i = int(np.sqrt(size))
        while size % i != 0:
            i -= 1
        shape = (i, size // i)
    nrow, ncol = shape
    assert size == nrow * ncol, "The shape doesn't match the size provided."
    topo = np.zeros((size, size))
    for i in range(size):
        topo[i][i] = 1.0
        if (i + 1) % ncol != 0:
            topo[i][i + 1] = 1.0
            topo[i + 1][i] = 1.0
        if i + ncol < size:
            topo[i][i + ncol] = 1.0
            topo[i + ncol][i] = 1.0

    # According to Hasting rule (Policy 1) in https://arxiv.org/pdf/1702.05122.pdf
    # The neighbor definition in the paper is different from our implementation,
    # which includes the self node.
    topo_neighbor_with_self = [np.nonzero(topo[i])[0] for i in range(size)]
    for i in range(size):
        for j in topo_neighbor_with_self[i]:
            if i != j:
                topo[i][j] = 1.0 / max(len(topo_neighbor_with_self[i]), len(topo_neighbor_with_self[j]))
        topo[i][i] = 2.0 - topo[i].sum()
    G = nx.from_numpy_array(topo, create_using=nx.DiGraph)
    return G


def StarGraph(size: int, center_rank: int = 0) -> nx.DiGraph:
    """Generate star structure of graph.

    All other ranks are connected to the center_rank. The connection is
    bidirection, i.e. if the weight from node i to node j is non-zero, so
    is the weight from node j to node i."""
    assert size > 0
    topo = np.zeros((size, size))
    for i in range(size):
        topo[i, i] = 1 - 1 / size
        topo[center_rank, i] = 1 / size
        topo[i, center_rank] = 1 / size
    G = nx.from_numpy_array(topo, create_using=nx.DiGraph)
    return G


def RingGraph(size: int, connect_style: int = 0) -> nx.DiGraph:
    """Generate ring structure of graph (uniliteral).
    Argument connect_style should be an integer between 0 and 2, where
    0 represents the bi-connection, 1 represents the left-connection,
    and 2 represents the right-connection."""
    assert size > 0
    assert connect_style >= 0 and connect_style <= 2, (
        "connect_style has to be int between 0 and 2, where 1 "
        "for bi-connection, 1 for left connection, 2 for right connection."
    )
    if size == 1:
        return nx.from_numpy_array(np.array([[1.0]]), create_using=nx.DiGraph)
    if size == 2:
        return nx.from_numpy_array(np.array([[0.5, 0.5], [0.5, 0.5]]), create_using=nx.DiGraph)

    x = np.zeros(size)
    x[0] = 0.5
    if connect_style == 0:  # bi-connection
        x[0] = 1 / 3.0
        x[-1] = 1 / 3.0
        x[1] = 1 / 3.0
    elif connect_style == 1:  # left-connection
        x[-1] = 0.5
    elif connect_style == 2:  # right-connection
        x[1] = 0.5
    else:
        raise ValueError("Connect_style has to be int between 0 and 2")

    topo = np.empty((size, size))
    for i in range(size):
        topo[i] = np.roll(x, i)
    G = nx.from_numpy_array(topo, create_using=nx.DiGraph)
    return G


def FullyConnectedGraph(size: int) -> nx.DiGraph:
    """Generate fully connected structure of graph."""
    assert size > 0
    x = np.array([1 / size] * size)
    topo = np.empty((size, size))
    for i in range(size):
        topo[i] = np.roll(x, i)
    G = nx.from_numpy_array(topo, create_using=nx.DiGraph)
    return G


def GetDynamicOnePeerSendRecvRanks(topo: nx.DiGraph, self_rank: int) -> Iterator[Tuple[List[int], List[int]]]:
    """A utility function to generate 1-outoging send rank and corresponding recieving rank(s)."""
    # Generate all outgoing ranks sorted by clock-wise. (Imagine all ranks put on a clock.)
    size = topo.number_of_nodes()
    sorted_send_ranks = []
    for rank in range(size):
        sorted_ranks = sorted(
            topo.successors(rank), key=lambda r, rk=rank: r - rk if r >= rk else r - rk + size
        )
        if sorted_ranks[0] == rank:
            sorted_ranks = sorted_ranks[1:]  # remove the self-loop
        sorted_send_ranks.append(sorted_ranks)

    self_degree = topo.out_degree(self_rank) - 1
    index = 0
    while True:
        send_rank = sorted_send_ranks[self_rank][index % self_degree]
        recv_ranks = []
        for other_rank in range(size):
            if other_rank == self_rank:
                continue
            degree = topo.out_degree(other_rank) - 1
            if sorted_send_ranks[other_rank][index % degree] == self_rank:
                recv_ranks.append(other_rank)

        yield [send_rank], recv_ranks
        index += 1


def GetExp2DynamicSendRecvMachineRanks(
    world_size: int, local_size: int, self_rank: int, local_rank: int
) -> Iterator[Tuple[List[int], List[int]]]:
    """
    A utility function to generate 1-outgoing send machine id and corresponding recieving
    machine id(s) for Exponentia-2 topology."""
    assert (self_rank % local_size) == local_rank, "It should be used under homogeneous environment only."
    assert (world_size % local_size) == 0, "It should be used under homogeneous environment only."
    assert world_size > local_size, "It should be used under at least two machines case."

    machine_id = self_rank // local_size
    machine_size = world_size // local_size
    exp_2_size = int(np.log2(machine_size - 1)) if machine_size > 1 else 0
    index = 0
    while True:
        machine_dist = 2 ** (index % (exp_2_size + 1))
        send_machine_rank = (machine_id + machine_dist) % machine_size
        recv_machine_ranks = (machine_id - machine_dist) % machine_size
        yield [send_machine_rank], [recv_machine_ranks]
        index += 1


def GetInnerOuterRingDynamicSendRecvRanks(
    world_size: int, local_size: int, self_rank: int
) -> Iterator[Tuple[List[int], List[int]]]:
    """
    A utility function to generate 1-outgoing send rank and corresponding recieving rank(s)
    for Inner-Ring-Outer-Ring topology."""
    num_machines = world_size // local_size
    nodes_per_machine = local_size
    assert world_size % local_size == 0, "It should be used under homogeneous environment only."
    assert local_size > 2, (
        "Do no support the case where nodes_per_machine is equal or "
        "less than 2. Consider use hierarchical_neighbor_allreduce or GetDynamicOnePeerSendRecvRanks."
    )

    index = 0
    while True:
        machine_id = self_rank // nodes_per_machine
        local_rank_id = self_rank % nodes_per_machine
        local_rank_to_go_outside_id = index % nodes_per_machine

        if local_rank_to_go_outside_id == local_rank_id:
            # find send_rank
            target_machine_id = (machine_id + 1) % num_machines
            target_rank_id = target_machine_id * nodes_per_machine + local_rank_id
            send_rank = target_rank_id

            # find recv_rank
            source_machine_id = (machine_id - 1) % num_machines
            source_rank_id = source_machine_id * nodes_per_machine + local_rank_id
            recv_rank = source_rank_id

        else:
            # find send_rank
            target_local_rank_id = (local_rank_id + 1) % nodes_per_machine
            if target_local_rank_id == local_rank_to_go_outside_id:
                target_local_rank_id = (target_local_rank_id + 1) % nodes_per_machine
            target_rank_id = target_local_rank_id + machine_id * nodes_per_machine
            send_rank = target_rank_id

            # find recv_rank
            source_local_rank_id = (local_rank_id - 1) % nodes_per_machine
            if source_local_rank_id == local_rank_to_go_outside_id:
                source_local_rank_id = (source_local_rank_id - 1) % nodes_per_machine
            source_rank_id = source_local_rank_id + machine_id * nodes_per_machine
            recv_rank = source_rank_id

        yield [send_rank], [recv_rank]
        index += 1


def GetInnerOuterExpo2DynamicSendRecvRanks(
    world_size: int, local_size: int, self_rank: int
) -> Iterator[Tuple[List[int], List[int]]]:
    """
    A utility function to generate 1-outgoing send rank and corresponding recieving rank(s)
    for Inner-Exp2-Outer-Exp2 ring topology."""
    num_machines = world_size // local_size
    nodes_per_machine = local_size
    assert world_size % local_size == 0, "It should be used under homogeneous environment only."
    assert local_size > 2, (
        "Do no support the case where nodes_per_machine is equal or "
        "less than 2. Consider use hierarchical_neighbor_allreduce or GetDynamicOnePeerSendRecvRanks."
    )

    exp_2_out_size = int(np.log2(num_machines - 1))
    if nodes_per_machine == 2:
        exp_2_in_size = 0
    else:
        # -2 because we need to remove outgoing node
        exp_2_in_size = int(np.log2(nodes_per_machine - 2))

    index = 0
    while True:
        machine_id = self_rank // nodes_per_machine
        local_rank_id = self_rank % nodes_per_machine
        local_rank_to_go_outside_id = index % nodes_per_machine

        if local_rank_to_go_outside_id == local_rank_id:
            # Note: currently design is still not very good. Because some local rank i may NEVER
            # directly talk to other machine's local rank i. Example:
            #
            # Assume num_machines=16, nodes_per_machine=4, and self_rank=1, then we know that
            # exp_2_out_size=3, and local_rank_id=1. If this branch is reached,
            # local_rank_to_go_outside_id=1, and index % (exp_2_out_size+1)=1, resulting in
            # next_machine_dist always equal to 2.
            next_machine_dist = 2 ** (index % (exp_2_out_size + 1))
            # find send_rank
            target_machine_id = (machine_id + next_machine_dist) % num_machines
            target_rank_id = target_machine_id * nodes_per_machine + local_rank_id
            send_rank = target_rank_id

            # find recv_rank
            source_machine_id = (machine_id - next_machine_dist) % num_machines
            source_rank_id = source_machine_id * nodes_per_machine + local_rank_id
            recv_rank = source_rank_id

        else:
            # Distance from self to out-rank:
            dist_to_out = (local_rank_to_go_outside_id - local_rank_id) % nodes_per_machine
            next_inner_dist = 2 ** (index % (exp_2_in_size + 1))
            if next_inner_dist >= dist_to_out:
                next_inner_dist += 1

            # find send_rank
            target_local_rank_id = (local_rank_id + next_inner_dist) % nodes_per_machine
            target_rank_id = target_local_rank_id + machine_id * nodes_per_machine
            send_rank = target_rank_id

            reverse_inner_dist = 2 ** (index % (exp_2_in_size + 1))
            reverse_dist_to_out = (local_rank_id - local_rank_to_go_outside_id) % nodes_per_machine
            if reverse_inner_dist >= reverse_dist_to_out:
                reverse_inner_dist += 1

            # find recv_rank
            source_local_rank_id = (local_rank_id - reverse_inner_dist) % nodes_per_machine
            source_rank_id = source_local_rank_id + machine_id * nodes_per_machine
            recv_rank = source_rank_id

        yield [send_rank], [recv_rank]
        index += 1


# -- BlueFog's arithmetic outside topology_util ------------------------------------------------------
def example_weights(recv_neighbors: List[int]) -> Tuple[float, Dict[int, float]]:
    """self_weight and src_weights as every BlueFog example sets them for a dynamic step
    (examples/pytorch_benchmark.py: ``optimizer.src_weights = {r: 1/(len(recv_neighbors) + 1) for r in
    recv_neighbors}``, ``optimizer.self_weight = 1 / (len(recv_neighbors) + 1)``)."""
    src_weights = {r: 1 / (len(recv_neighbors) + 1) for r in recv_neighbors}
    self_weight = 1 / (len(recv_neighbors) + 1)
    return self_weight, src_weights


def hierarchical_neighbor_allreduce(
    values: List[float],
    local_size: int,
    self_weight: List[float],
    src_machine_weights: List[Dict[int, float]],
    dst_machine_weights: List[List[int]],
) -> List[float]:
    """Every rank's result of ``bf.hierarchical_neighbor_allreduce`` (per-rank arguments indexed by rank).

    1. ``MPI_Allreduce(MPI_IN_PLACE, ..., MPI_SUM, LOCAL)``: each rank's tensor becomes its machine's sum.
    2. Local rank 0 of each machine sends that sum to local rank 0 of each ``dst`` machine and
       receives from local rank 0 of each ``src`` machine (mpi_ops.py translates machine m to rank
       ``local_size * m``); 3. ``MPI_Bcast`` of the received data from local rank 0 to its machine.
    4. ``PerformNeighborAllreduceCallback`` (avg_computation): ``sum_m w_m * recv_m + self_weight *
       tensor``, then ``div_(bluefog_local_size())`` "because there is ncclAllreduce just take sum".
       With uniform weights (the examples' 1/(len+1)) BlueFog takes its sum path instead,
       ``(sum_m recv_m + tensor) / (local_size * (src_size + 1))``: the same number.
    """
    size = len(values)
    machines = size // local_size
    sums = [sum(values[m * local_size : (m + 1) * local_size]) for m in range(machines)]
    tensor = [sums[r // local_size] for r in range(size)]  # 1. in place
    out = []
    for r in range(size):
        leader = (r // local_size) * local_size
        for m in src_machine_weights[leader]:  # 2. what local rank 0 received: a matching send
            assert r // local_size in dst_machine_weights[local_size * m]
        recv = {local_size * m: tensor[local_size * m] for m in src_machine_weights[leader]}  # 3.
        reduced = sum(w * recv[local_size * m] for m, w in src_machine_weights[r].items())
        out.append((reduced + self_weight[r] * tensor[r]) / local_size)  # 4.
    return out
