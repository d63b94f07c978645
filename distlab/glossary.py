"""The vocabulary distlab uses everywhere, fixed in one place.

rank
    One training process; ranks are numbered 0..world-1 and ordered by (host, worker address).
world
    The number of ranks taking part in one run.
replica
    The copy of the model a rank trains; data parallelism runs one replica per rank.
variable
    One trainable tensor of the model (a ``named_parameters`` entry).
server
    A rank that owns a variable (or a shard) under parameter-server sync: it reduces the
    gradient, applies the optimizer to it (it alone keeps that optimizer state) and broadcasts
    the new value.
group
    A set of variables all-reduced together (one bucket of collective traffic).
shard
    One slice of a partitioned variable along ``partition.axis``; each shard has its own sync.
topology
    The weighted directed graph gossip averages over; ``weights[i, j]`` is the weight of the
    edge i -> j, self loops on the diagonal, and rank j combines ``x_j <- sum_i weights[i, j] x_i``
    (BlueFog's convention).
window
    A named tensor's one-sided mailbox on each rank (BlueFog's ``win_*``; runtime/window.py): a
    buffer per in-neighbour that peers ``put`` into (overwrite) or ``accumulate`` into (add).
push-sum
    Gossip that carries a weight p with every message and reads the parameters as x / p; sums of
    x and p are conserved, so it averages exactly without a barrier (asynchronous gossip).
consensus distance
    The mean over ranks of ||x_r - mean x||^2: how far gossip's replicas are apart.
step
    One global optimizer step: every rank processes its per-replica batch once (times the
    accumulation steps) and synchronises.
"""
