"""Alpha-beta cost factors of the collectives distlab uses (Thakur, Rabenseifner & Gropp 2005).

Every collective costs ``a(p) * alpha + b(p) * n * beta`` on ``p`` ranks for ``n`` bytes, where
alpha is the per-message latency and beta the seconds per byte of one link. The factors below
are the textbook ones for the algorithms gloo and NCCL use for large messages:

- ring all-reduce (reduce-scatter + all-gather): ``2(p-1) alpha + 2(p-1)/p n beta``
- binomial-tree reduce and broadcast: ``ceil(log2 p) (alpha + n beta)``
- ring all-gather of ``n`` bytes contributed per rank: ``(p-1) alpha + (p-1) n beta``
  (linear in p: every rank ends up receiving every other rank's contribution)
- one point-to-point message (send/recv, one-peer gossip): ``alpha + n beta``; ``sendrecv`` is a
  pairwise exchange (each side sends and receives ``n`` at once, as gossip does), ``send`` one
  message one way: a link's own rate (gloo's exchange over a shaped TCP link can get half of it)

Functions take numpy arrays (or scalars) of ``p`` so the simulator evaluates many configurations
at once; a world of one rank costs nothing.
"""

from __future__ import annotations

import numpy as np

COLLECTIVES = ("allreduce", "reduce", "broadcast", "allgather", "sendrecv", "send")
LINK_CLASSES = ("intra", "inter")


def log2_ceil(p: np.ndarray | float) -> np.ndarray:
    """ceil(log2 p) for p >= 1 (0 for a single rank): the rounds of a binomial tree."""
    p = np.maximum(np.asarray(p, dtype=float), 1.0)
    return np.ceil(np.log2(p) - 1e-12)


def factors(collective: str, p: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """``(a(p), b(p))``: how many alphas and how many ``n * beta`` one call costs on p ranks."""
    p = np.asarray(p, dtype=float)
    many = p > 1
    if collective == "allreduce":
        return 2 * (p - 1) * many, np.where(many, 2 * (p - 1) / np.maximum(p, 1), 0.0)
    if collective in ("reduce", "broadcast"):
        r = log2_ceil(p) * many
        return r, r
    if collective == "allgather":
        return (p - 1) * many, (p - 1) * many
    if collective in ("sendrecv", "send"):
        one = np.where(many, 1.0, 0.0)
        return one, one
    raise ValueError(f"collective {collective!r}: expected one of {COLLECTIVES}")


def collective_time(
    collective: str, p: np.ndarray | float, nbytes: np.ndarray | float, alpha: float, beta: float
) -> np.ndarray:
    """Seconds of one call of ``collective`` on ``p`` ranks moving ``nbytes`` (see module docstring)."""
    a, b = factors(collective, p)
    return a * alpha + b * np.asarray(nbytes, dtype=float) * beta
