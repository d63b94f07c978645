"""Gossip topologies: every one named after BlueFog equals BlueFog's definition (``bluefog_reference``,
a transcription of its code at 9ee376a) option for option, for n in 1..40 and bases 2..5, each
convention in a test of its own name; doubly stochastic weights, exact one-peer averaging, spectral gaps.

Long because the BlueFog comparisons and the conventions they pin down read best side by side."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

import distlab as dl
from distlab.errors import DistlabError
from distlab.topology import Topology, TopologySchedule
from tests import bluefog_reference as bf

get = dl.topology.get
NS = range(1, 41)
BASES = range(2, 6)
# (distlab builder, BlueFog's), each over n; every option value BlueFog has, and each default
STATIC = {
    "exp2": (lambda n: get("exp2", n), bf.ExponentialTwoGraph),
    "exponential": (lambda n: get("exponential", n), bf.ExponentialGraph),
    **{
        f"exponential(base={b})": (
            lambda n, b=b: get("exponential", n, base=b),
            lambda n, b=b: bf.ExponentialGraph(n, b),
        )
        for b in BASES
    },
    "symmetric_exponential": (lambda n: get("symmetric_exponential", n), bf.SymmetricExponentialGraph),
    **{
        f"symmetric_exponential(base={b})": (
            lambda n, b=b: get("symmetric_exponential", n, base=b),
            lambda n, b=b: bf.SymmetricExponentialGraph(n, b),
        )
        for b in BASES
    },
    "ring": (lambda n: get("ring", n), bf.RingGraph),
    **{
        f"ring(connect_style={c})": (
            lambda n, c=c: get("ring", n, connect_style=c),
            lambda n, c=c: bf.RingGraph(n, c),
        )
        for c in (0, 1, 2)
    },
    "star": (lambda n: get("star", n), bf.StarGraph),
    "mesh2d": (lambda n: get("mesh2d", n), bf.MeshGrid2DGraph),
    "full": (lambda n: get("full", n), bf.FullyConnectedGraph),
}


def assert_equals_bluefog(topo: Topology, graph: nx.DiGraph) -> None:
    ref = nx.to_numpy_array(graph)  # as BlueFog's GetRecvWeights reads it: [i, j] = edge i -> j
    np.testing.assert_array_equal(topo.weights != 0, ref != 0)  # the same edges
    np.testing.assert_allclose(topo.weights, ref, rtol=0, atol=1e-15)  # the same weights, to rounding


def assert_schedule_equals_bluefog(sched: TopologySchedule, gens: list, steps: int) -> None:
    """Per step and rank: sends, receives, and the weights BlueFog's examples use with them."""
    for t in range(steps):
        topo = sched.at(t)
        for r, gen in enumerate(gens):
            send, recv = next(gen)
            assert topo.out_neighbors(r) == sorted(send), (t, r)
            assert topo.in_neighbors(r) == sorted(recv), (t, r)
            self_weight, src_weights = bf.example_weights(recv)
            assert topo.in_weights(r) == {r: self_weight, **src_weights}, (t, r)


def host_shapes(least: int) -> list[tuple[int, int]]:
    """(hosts, ranks per host) with at least 2 hosts, ``least`` ranks per host, 40 ranks at most."""
    return [(m, k) for m in range(2, 21) for k in range(least, 21) if m * k <= 40]


# -- static: equal to BlueFog ----------------------------------------------------------------------
@pytest.mark.parametrize("case", STATIC)
def test_every_static_topology_and_option_equals_bluefogs_for_n_1_to_40(case):
    ours, theirs = STATIC[case]
    for n in NS:
        assert_equals_bluefog(ours(n), theirs(n))


def test_star_equals_bluefogs_for_every_center_rank():
    for n in NS:
        for c in range(n):
            assert_equals_bluefog(get("star", n, center_rank=c), bf.StarGraph(n, center_rank=c))


def test_mesh2d_equals_bluefogs_for_every_shape():
    for n in NS:
        for rows in (r for r in range(1, n + 1) if n % r == 0):
            shape = (rows, n // rows)
            assert_equals_bluefog(get("mesh2d", n, shape=shape), bf.MeshGrid2DGraph(n, shape=shape))


def test_weights_i_j_are_edge_i_to_j_and_rank_j_combines_column_j_as_bluefogs_get_recv_weights():
    for topo, graph in [
        (get("ring", 5, connect_style=2), bf.RingGraph(5, 2)),
        (get("exponential", 10, base=3), bf.ExponentialGraph(10, 3)),
    ]:
        for r in range(topo.n):
            self_weight, recv = bf.GetRecvWeights(graph, r)
            assert topo.in_weights(r) == pytest.approx({r: self_weight, **recv}, abs=1e-15)
            self_weight, send = bf.GetSendWeights(graph, r)
            assert topo.self_weight(r) == pytest.approx(self_weight) and topo.out_neighbors(r) == sorted(send)
    assert bf.GetRecvWeights(bf.RingGraph(5, 2), 1) == (0.5, {0: 0.5})  # 0 sends right, to 1


def test_ring_connect_style_0_averages_self_and_both_neighbours_at_one_third_as_bluefog():
    t = get("ring", 5)
    assert t.in_weights(0) == pytest.approx({0: 1 / 3, 1: 1 / 3, 4: 1 / 3})
    assert get("ring", 5, connect_style=0).name == "ring"


def test_ring_connect_style_1_sends_to_the_left_neighbour_as_bluefog():
    t = get("ring", 5, connect_style=1)
    assert [t.out_neighbors(r) for r in range(5)] == [[4], [0], [1], [2], [3]]
    assert t.in_weights(0) == {0: 0.5, 1: 0.5} and t.name == "ring(connect_style=1)"


def test_ring_connect_style_2_sends_to_the_right_neighbour_as_bluefog():
    t = get("ring", 5, connect_style=2)
    assert [t.out_neighbors(r) for r in range(5)] == [[1], [2], [3], [4], [0]]
    assert t.in_weights(0) == {0: 0.5, 4: 0.5}


def test_ring_of_one_or_two_ranks_is_the_same_for_every_connect_style_as_bluefog():
    for c in (0, 1, 2):
        np.testing.assert_array_equal(get("ring", 1, connect_style=c).weights, [[1.0]])
        np.testing.assert_array_equal(get("ring", 2, connect_style=c).weights, [[0.5, 0.5], [0.5, 0.5]])


def test_ring_option_is_bluefogs_name_connect_style():
    with pytest.raises(DistlabError, match="unknown option 'style'; valid: connect_style"):
        get("ring", 4, style=1)
    with pytest.raises(DistlabError, match="connect_style must be 0, 1 or 2, got 3"):
        get("ring", 4, connect_style=3)


def test_symmetric_exponential_default_base_is_4_as_bluefog():
    assert get("symmetric_exponential", 40).out_neighbors(0) == [1, 4, 16, 24, 36, 39]
    se = get("symmetric_exponential", 8, base=2)
    assert se.out_neighbors(0) == [1, 2, 4, 6, 7] and se.name == "symmetric_exponential(base=2)"
    np.testing.assert_allclose(se.weights, se.weights.T)


def test_mesh2d_default_shape_is_the_two_closest_factors_fewer_rows_as_bluefog():
    t = get("mesh2d", 24)  # 4 rows x 6 columns, rank r at row r // 6
    assert t.out_neighbors(6) == [0, 7, 12] and t.out_neighbors(5) == [4, 11]
    line = get("mesh2d", 7)  # a prime: 1 x 7
    assert line.out_neighbors(0) == [1] and line.out_neighbors(3) == [2, 4]


def test_mesh2d_shape_is_nrow_ncol_with_ranks_laid_row_by_row_as_bluefog():
    t = get("mesh2d", 24, shape=(6, 4))
    assert t.out_neighbors(4) == [0, 5, 8] and t.out_neighbors(3) == [2, 7]
    with pytest.raises(DistlabError, match=r"mesh2d: shape 5 x 5 is 25 ranks, not 24; pass shape=None"):
        get("mesh2d", 24, shape=(5, 5))
    with pytest.raises(DistlabError, match=r"shape must be \(nrow, ncol\)"):
        get("mesh2d", 24, shape=24)


def test_mesh2d_weights_are_hastings_with_self_in_the_degree_as_bluefog():
    t = get("mesh2d", 6)  # 2 x 3 grid
    np.testing.assert_allclose(t.weights, t.weights.T)
    # corner 0 (degree 2+1) to middle 1 (degree 3+1): 1 / max(3, 4)
    assert t.weights[0, 1] == pytest.approx(0.25) and t.weights[0, 3] == pytest.approx(1 / 3)
    assert t.out_neighbors(4) == [1, 3, 5]


def test_star_center_rank_keeps_1_over_n_and_each_leaf_1_minus_1_over_n_as_bluefog():
    s = get("star", 5, center_rank=2)
    assert s.out_neighbors(2) == [0, 1, 3, 4] and s.out_neighbors(3) == [2]
    assert s.in_weights(2) == pytest.approx({r: 0.2 for r in range(5)})
    assert s.in_weights(0) == pytest.approx({0: 0.8, 2: 0.2})


def test_full_is_1_over_n_everywhere_as_bluefog():
    assert get("full", 4).spectral_gap() == pytest.approx(1.0)
    np.testing.assert_array_equal(get("full", 4).weights, np.full((4, 4), 0.25))


# BlueFog's isPowerOf(x, base) is base ** int(math.log(x, base)) == x: the float log lands below
# these exact powers, so BlueFog's graphs leave them out (bases 2..10, powers below 1024)
BLUEFOG_MISSES = {(3, 243), (10, 1000)}


def test_exponential_connects_every_exact_power_where_bluefogs_float_log_misses_243_and_1000():
    powers = {(b, b**k) for b in range(2, 11) for k in range(11) if b**k < 1024}
    assert {(b, p) for b, p in powers if not bf.isPowerOf(p, b)} == BLUEFOG_MISSES
    assert not [
        (b, x) for b in range(2, 11) for x in range(1, 1024) if bf.isPowerOf(x, b) and (b, x) not in powers
    ]
    for base, p in BLUEFOG_MISSES:  # differs exactly by the edges r -> r + p, from n = p + 1 on
        ours, ref = get("exponential", p + 1, base=base), nx.to_numpy_array(bf.ExponentialGraph(p + 1, base))
        assert ours.out_neighbors(0)[-1] == p and p not in np.flatnonzero(ref[0])
        assert_equals_bluefog(get("exponential", p, base=base), bf.ExponentialGraph(p, base))
    # symmetric_exponential: r +/- 243 from n = 486 (243 <= n // 2) on
    assert_equals_bluefog(get("symmetric_exponential", 485, base=3), bf.SymmetricExponentialGraph(485, 3))
    ours, ref = (
        get("symmetric_exponential", 486, base=3),
        nx.to_numpy_array(bf.SymmetricExponentialGraph(486, 3)),
    )
    assert 243 in ours.out_neighbors(0) and not ref[0, 243]


# -- dynamic: equal to BlueFog ---------------------------------------------------------------------
def test_one_peer_exp2_equals_bluefogs_one_peer_schedule_on_exponential_two_graph():
    for n in NS[1:]:
        sched = get("one_peer_exp2", n)
        graph = bf.ExponentialTwoGraph(n)
        gens = [bf.GetDynamicOnePeerSendRecvRanks(graph, r) for r in range(n)]
        assert_schedule_equals_bluefog(sched, gens, 2 * sched.period)


@pytest.mark.parametrize(
    "case",
    [
        "exp2",
        "exponential(base=3)",
        "symmetric_exponential",
        "ring(connect_style=1)",
        "star",
        "mesh2d",
        "full",
    ],
)
def test_dynamic_true_is_bluefogs_one_peer_schedule_for_every_static_topology(case):
    ours, theirs = STATIC[case]
    for n in NS[1:]:
        sched, graph = get(case.split("(")[0], n, dynamic=True, **_options(case)), theirs(n)
        assert isinstance(sched, TopologySchedule) and sched.name.endswith("(dynamic)")
        gens = [bf.GetDynamicOnePeerSendRecvRanks(graph, r) for r in range(n)]
        assert_schedule_equals_bluefog(sched, gens, 2 * sched.period)


def _options(case: str) -> dict:
    if "(" not in case:
        return {}
    key, value = case[case.index("(") + 1 : -1].split("=")
    return {key: int(value)}


def test_one_peer_rank_receives_from_every_rank_whose_turn_sends_to_it_as_bluefog():
    step = get("star", 5, dynamic=True).at(0)  # the centre sends to leaf 1; every leaf to the centre
    assert step.in_weights(0) == pytest.approx({r: 0.2 for r in range(5)})
    assert step.in_weights(1) == {0: 0.5, 1: 0.5} and step.in_weights(3) == {3: 1.0}  # hears nobody
    # BlueFog's weights on a star: columns sum to one, rows do not (the average drifts)
    np.testing.assert_allclose(step.weights.sum(axis=0), 1.0)
    assert not step.is_doubly_stochastic() and get("star", 5, dynamic=True).period == 4


def test_one_peer_on_one_rank_is_the_identity_where_bluefog_divides_by_zero():
    with pytest.raises(ZeroDivisionError):
        next(bf.GetDynamicOnePeerSendRecvRanks(bf.ExponentialTwoGraph(1), 0))
    sched = get("one_peer_exp2", 1)
    assert sched.period == 1 and sched.at(0).weights.tolist() == [[1.0]]


@pytest.mark.parametrize("hosts, k", host_shapes(2))
def test_hierarchical_exchange_steps_are_bluefogs_exp2_machine_schedule_and_even_steps_the_host_mean(
    hosts, k
):
    n = hosts * k
    sched = get("hierarchical", n, ranks_per_host=k)
    gens = [bf.GetExp2DynamicSendRecvMachineRanks(n, k, r, r % k) for r in range(n)]
    for s in range(sched.period):  # two of BlueFog's periods
        inner, outer = sched.at(2 * s), sched.at(2 * s + 1)
        for r in range(n):
            (send,), (recv,) = next(gens[r])
            assert outer.out_neighbors(r) == [send * k + r % k] and outer.in_neighbors(r) == [
                recv * k + r % k
            ]
            assert outer.in_weights(r) == {r: 0.5, recv * k + r % k: 0.5}
            assert inner.in_weights(r) == {j: 1 / k for j in range(r // k * k, r // k * k + k)}


@pytest.mark.parametrize("hosts, k", host_shapes(2))
def test_hierarchical_two_steps_compose_to_one_bluefog_hierarchical_neighbor_allreduce_step(hosts, k):
    n = hosts * k
    sched = get("hierarchical", n, ranks_per_host=k)
    gens = [bf.GetExp2DynamicSendRecvMachineRanks(n, k, r, r % k) for r in range(n)]
    x = np.random.default_rng(n).normal(size=n)
    for s in range(sched.period):
        sends, recvs = zip(*(next(g) for g in gens))
        weights = [bf.example_weights(recv) for recv in recvs]
        theirs = bf.hierarchical_neighbor_allreduce(
            list(x), k, [w for w, _ in weights], [src for _, src in weights], list(sends)
        )
        x = sched.at(2 * s + 1).weights.T @ (sched.at(2 * s).weights.T @ x)  # x_j <- sum_i w[i, j] x_i
        np.testing.assert_allclose(x, theirs, rtol=0, atol=1e-12)


def test_hierarchical_refuses_what_bluefog_refuses():
    with pytest.raises(DistlabError, match="hierarchical: needs at least 2 hosts"):
        get("hierarchical", 4)  # BlueFog: "It should be used under at least two machines case."
    with pytest.raises(DistlabError, match="hierarchical: needs at least 2 ranks per host.*one_peer_exp2"):
        get("hierarchical", 4, ranks_per_host=1)  # BlueFog: "If local size is 1, ... neighbor allreduce"
    with pytest.raises(DistlabError, match="hierarchical: needs the same number of ranks on every host"):
        get("hierarchical", 3, hosts=["a", "a", "b"])
    with pytest.raises(AssertionError, match="at least two machines"):
        next(bf.GetExp2DynamicSendRecvMachineRanks(4, 4, 0, 0))


@pytest.mark.parametrize("name", ["inner_outer_ring", "inner_outer_exp2"])
def test_inner_outer_schedules_equal_bluefogs_with_the_examples_weights(name):
    reference = {
        "inner_outer_ring": bf.GetInnerOuterRingDynamicSendRecvRanks,
        "inner_outer_exp2": bf.GetInnerOuterExpo2DynamicSendRecvRanks,
    }[name]
    for hosts, k in host_shapes(3):
        n = hosts * k
        sched = get(name, n, hosts=[f"h{r // k}" for r in range(n)])
        assert sched.period == get(name, n, ranks_per_host=k).period
        gens = [reference(n, k, r) for r in range(n)]
        assert_schedule_equals_bluefog(sched, gens, 2 * sched.period)
        for t in range(sched.period):  # one send and one receive per rank
            assert sched.at(t).is_doubly_stochastic()


@pytest.mark.parametrize("name", ["inner_outer_ring", "inner_outer_exp2"])
def test_inner_outer_refuses_bluefogs_preconditions_in_one_line(name):
    with pytest.raises(
        DistlabError, match=f"{name}: needs at least 3 ranks per host .*, got 2; use hierarchical"
    ):
        get(name, 8, ranks_per_host=2)
    with pytest.raises(
        DistlabError, match=f"{name}: needs at least 2 hosts, got all 6 ranks on one; pass hosts="
    ):
        get(name, 6)
    with pytest.raises(DistlabError, match=f"{name}: ranks_per_host must divide 8, got 3"):
        get(name, 8, ranks_per_host=3)
    with pytest.raises(AssertionError, match="nodes_per_machine is equal or less than 2"):
        next(bf.GetInnerOuterRingDynamicSendRecvRanks(8, 2, 0))


# -- distlab's own properties ----------------------------------------------------------------------
def all_steps(t):
    return [t.at(s) for s in range(t.period)] if t.dynamic else [t]


def circulant_eigenvalues(n, offsets):
    """Eigenvalues of the circulant matrix with uniform weight on each offset: sum_k c_k w^(m k)."""
    ks = sorted({k % n for k in offsets} | {0})
    return np.array([sum(np.exp(2j * np.pi * m * k / n) for k in ks) / len(ks) for m in range(n)])


HOSTED = {"hierarchical": 2, "inner_outer_ring": 3, "inner_outer_exp2": 3}


@pytest.mark.parametrize("name", dl.topology.names())
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8, 12, 16])
def test_every_builtin_is_doubly_stochastic(name, n):
    k = HOSTED.get(name)
    if k is not None and (n % k or n == k or n < k):
        pytest.skip(f"{name} needs 2+ hosts of {k} ranks; {n} ranks are not")
    t = get(name, n, **({"ranks_per_host": k} if k else {}))
    for step in all_steps(t):
        w = step.weights
        assert w.shape == (n, n) and w.dtype == np.float64
        assert (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=0), 1.0, atol=1e-12)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_one_peer_exp2_averages_exactly_after_log2_n_steps(n):
    sched = get("one_peer_exp2", n)
    assert sched.dynamic and sched.period == int(math.log2(n))
    x = np.random.default_rng(0).normal(size=(n, 3))
    for step in range(sched.period):
        x = sched.at(step).weights.T @ x  # x_j <- sum_i w[i, j] x_i
    np.testing.assert_allclose(x, np.broadcast_to(x.mean(0), x.shape), atol=1e-12)
    assert sched.spectral_gap() == pytest.approx(1.0)


@pytest.mark.parametrize("n", [6, 12])
def test_one_peer_exp2_does_not_average_exactly_when_n_is_not_a_power_of_two(n):
    sched = get("one_peer_exp2", n)
    x = np.arange(n, dtype=float)
    for step in range(sched.period):
        x = sched.at(step).weights.T @ x
    assert np.ptp(x) > 1e-3
    assert np.isclose(x.mean(), (n - 1) / 2)  # the average itself is preserved


def test_one_peer_exp2_neighbours():
    t = get("one_peer_exp2", 8).at(2)  # offset 4
    assert t.out_neighbors(1) == [5] and t.in_neighbors(1) == [5]
    t = get("one_peer_exp2", 8).at(4)  # step 4 -> 4 mod 3 = 1 -> offset 2
    assert t.out_neighbors(7) == [1] and t.in_neighbors(7) == [5]
    assert t.in_weights(7) == {5: 0.5, 7: 0.5}


@pytest.mark.parametrize("n", [3, 5, 8, 10])
def test_ring_spectral_gap_closed_form(n):
    expected = 1 - max(abs((1 + 2 * math.cos(2 * math.pi * k / n)) / 3) for k in range(1, n))
    assert get("ring", n).spectral_gap() == pytest.approx(expected, abs=1e-10)


@pytest.mark.parametrize("n", [4, 5, 8, 16, 17])
def test_exp2_spectral_gap_closed_form(n):
    offsets = [2**k for k in range(n.bit_length()) if 2**k < n]
    expected = 1 - np.sort(np.abs(circulant_eigenvalues(n, offsets)))[::-1][1]
    t = get("exp2", n)
    assert t.spectral_gap() == pytest.approx(expected, abs=1e-10)
    assert t.degree == len(offsets) and t.out_neighbors(0) == offsets


def test_exp2_neighbours_and_weights():
    t = get("exp2", 8)
    assert t.out_neighbors(0) == [1, 2, 4] and t.in_neighbors(0) == [4, 6, 7]
    assert t.weights[0, 0] == pytest.approx(0.25) and t.weights[0, 4] == pytest.approx(0.25)


def test_hierarchical_on_hosts():
    hosts = ["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["d"] * 4
    sched = get("hierarchical", 16, hosts=hosts)
    assert isinstance(sched, TopologySchedule) and sched.period == 4
    assert sched.at(0).out_neighbors(5) == [4, 6, 7]  # the host mean: all of host b
    assert sched.at(1).out_neighbors(5) == [9]  # rank 1 of host b -> rank 1 of host c
    assert sched.at(3).out_neighbors(5) == [13]


def test_bad_name_n_and_option():
    with pytest.raises(DistlabError, match="exp2, exponential"):
        get("torus", 4)
    with pytest.raises(DistlabError, match="n must be a positive"):
        get("ring", 0)
    with pytest.raises(DistlabError, match="star: center_rank must be a rank in 0..3, got 4"):
        get("star", 4, center_rank=4)
    with pytest.raises(DistlabError, match="base must be an integer >= 2"):
        get("symmetric_exponential", 4, base=1)


def test_topology_to_networkx_round_trip():
    t = get("exp2", 8)
    g = t.to_networkx()
    assert isinstance(t, Topology) and sorted(g.successors(0)) == [0, 1, 2, 4]
