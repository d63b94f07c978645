"""Gossip topologies: doubly stochastic weights, exact one-peer averaging, closed-form spectral gaps."""

from __future__ import annotations

import math

import numpy as np
import pytest

import distlab as dl
from distlab.errors import DistlabError
from distlab.topology import Topology, TopologySchedule


def all_steps(t):
    return [t.at(s) for s in range(t.period)] if t.dynamic else [t]


def circulant_eigenvalues(n, offsets):
    """Eigenvalues of the circulant matrix with uniform weight on each offset: sum_k c_k w^(m k)."""
    ks = sorted({k % n for k in offsets} | {0})
    return np.array([sum(np.exp(2j * np.pi * m * k / n) for k in ks) / len(ks) for m in range(n)])


@pytest.mark.parametrize("name", dl.topology.names())
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8, 12, 16])
def test_every_builtin_is_doubly_stochastic(name, n):
    opts = {"ranks_per_host": 2} if name == "hierarchical" and n % 2 == 0 else {}
    t = dl.topology.get(name, n, **opts)
    for step in all_steps(t):
        w = step.weights
        assert w.shape == (n, n) and w.dtype == np.float64
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_peer_exp2_averages_exactly_after_log2_n_steps(n):
    sched = dl.topology.get("one_peer_exp2", n)
    assert sched.dynamic and sched.period == int(math.log2(n))
    x = np.random.default_rng(0).normal(size=(n, 3))
    for step in range(sched.period):
        w = sched.at(step).weights
        x = w.T @ x  # x_j <- sum_i w[i, j] x_i
    np.testing.assert_allclose(x, np.broadcast_to(x.mean(0), x.shape), atol=1e-12)
    assert sched.spectral_gap() == pytest.approx(1.0)


@pytest.mark.parametrize("n", [6, 12])
def test_one_peer_exp2_does_not_average_exactly_when_n_is_not_a_power_of_two(n):
    sched = dl.topology.get("one_peer_exp2", n)
    x = np.arange(n, dtype=float)
    for step in range(sched.period):
        x = sched.at(step).weights.T @ x
    assert np.ptp(x) > 1e-3
    assert np.isclose(x.mean(), (n - 1) / 2)  # the average itself is preserved


def test_one_peer_exp2_neighbours():
    t = dl.topology.get("one_peer_exp2", 8).at(2)  # offset 4
    assert t.out_neighbors(1) == [5] and t.in_neighbors(1) == [5]
    t = dl.topology.get("one_peer_exp2", 8).at(4)  # step 4 -> 4 mod 3 = 1 -> offset 2
    assert t.out_neighbors(7) == [1] and t.in_neighbors(7) == [5]
    assert t.in_weights(7) == {5: 0.5, 7: 0.5}


@pytest.mark.parametrize("n", [3, 5, 8, 10])
def test_ring_spectral_gap_closed_form(n):
    expected = 1 - max(abs((1 + 2 * math.cos(2 * math.pi * k / n)) / 3) for k in range(1, n))
    assert dl.topology.get("ring", n).spectral_gap() == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize("n", [4, 5, 8, 16, 17])
def test_exp2_spectral_gap_closed_form(n):
    offsets = [2**k for k in range(n.bit_length()) if 2**k < n]
    lam = circulant_eigenvalues(n, offsets)
    expected = 1 - np.sort(np.abs(lam))[::-1][1]
    t = dl.topology.get("exp2", n)
    assert t.spectral_gap() == pytest.approx(expected, abs=1e-10)
    assert t.degree == len(offsets)
    assert t.out_neighbors(0) == offsets


def test_exp2_neighbours_and_weights():
    t = dl.topology.get("exp2", 8)
    assert t.out_neighbors(0) == [1, 2, 4]
    assert t.in_neighbors(0) == [4, 6, 7]
    assert t.weights[0, 0] == pytest.approx(0.25) and t.weights[0, 4] == pytest.approx(0.25)


def test_exponential_uses_exact_integer_powers():
    # 3^5 = 243: float log(243, 3) = 4.999..., which would miss or add an offset
    t = dl.topology.get("exponential", 244, base=3)
    assert t.out_neighbors(0) == [1, 3, 9, 27, 81, 243]
    assert dl.topology.get("exponential", 243, base=3).out_neighbors(0) == [1, 3, 9, 27, 81]


def test_ring_styles():
    r0, r1, r2 = (dl.topology.get("ring", 5, style=s) for s in (0, 1, 2))
    assert r0.in_neighbors(0) == [1, 4] and r0.weights[0, 1] == pytest.approx(1 / 3)
    assert r1.out_neighbors(0) == [1] and r1.weights[0, 1] == pytest.approx(0.5)
    assert r2.out_neighbors(0) == [4] and r2.weights[0, 0] == pytest.approx(0.5)


def test_mesh2d_metropolis_hastings():
    t = dl.topology.get("mesh2d", 6)  # 2 x 3 grid
    np.testing.assert_allclose(t.weights, t.weights.T)
    # corner 0 (degree 2+1) to middle 1 (degree 3+1): 1 / max(3, 4)
    assert t.weights[0, 1] == pytest.approx(0.25)
    assert t.weights[0, 3] == pytest.approx(1 / 3)
    assert t.out_neighbors(4) == [1, 3, 5]


def test_star_and_full_and_symmetric_exponential():
    s = dl.topology.get("star", 5)
    assert s.out_neighbors(0) == [1, 2, 3, 4] and s.out_neighbors(3) == [0]
    assert dl.topology.get("full", 4).spectral_gap() == pytest.approx(1.0)
    se = dl.topology.get("symmetric_exponential", 8)
    assert se.out_neighbors(0) == [1, 2, 4, 6, 7]
    np.testing.assert_allclose(se.weights, se.weights.T)


def test_hierarchical_two_level_schedule():
    hosts = ["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["d"] * 4
    sched = dl.topology.get("hierarchical", 16, hosts=hosts)
    assert isinstance(sched, TopologySchedule) and sched.period == 4
    inner = sched.at(0)
    assert all(hosts[j] == hosts[5] for j in inner.out_neighbors(5))
    outer = sched.at(1)
    assert outer.out_neighbors(5) == [9]  # rank 1 of host b -> rank 1 of host c
    assert sched.at(3).out_neighbors(5) == [13]
    with pytest.raises(DistlabError, match="same number of ranks on every host"):
        dl.topology.get("hierarchical", 3, hosts=["a", "a", "b"])


def test_dynamic_static_topology_is_one_peer():
    sched = dl.topology.get("exp2", 8, dynamic=True)
    assert [sched.at(t).out_neighbors(0) for t in range(sched.period)] == [[1], [2], [4]]
    with pytest.raises(DistlabError, match="circulant"):
        dl.topology.get("star", 4, dynamic=True)


def test_bad_name_n_and_option():
    with pytest.raises(DistlabError, match="exp2, exponential"):
        dl.topology.get("torus", 4)
    with pytest.raises(DistlabError, match="n must be a positive"):
        dl.topology.get("ring", 0)
    with pytest.raises(DistlabError, match="unknown option 'stlye'; valid: style"):
        dl.topology.get("ring", 4, stlye=1)
    with pytest.raises(DistlabError, match="style must be 0, 1 or 2"):
        dl.topology.get("ring", 4, style=3)


def test_topology_to_networkx_round_trip():
    t = dl.topology.get("exp2", 8)
    g = t.to_networkx()
    assert isinstance(t, Topology) and sorted(g.successors(0)) == [0, 1, 2, 4]
