"""Which rank a failed run names, when a peer's ``PeerFailed`` reaches the client first."""

from __future__ import annotations

import pickle

from distlab.cluster.spmd import RankFailure, first_cause
from distlab.runtime.process_group import PeerFailed


def _as_sent(rank: int, exc: BaseException) -> RankFailure:
    """What a rank sends back (spmd's wrapper), through pickle as Dask carries it."""
    failure = RankFailure(rank, "host", type(exc).__name__, str(exc), "tb")
    failure.peer = (exc.peer, exc.cause) if hasattr(exc, "peer") else None
    return pickle.loads(pickle.dumps(failure))


def test_the_raising_rank_is_named_even_when_only_its_peers_error_arrived():
    peer = _as_sent(0, PeerFailed(0, 1, "ValueError: sample 120 is corrupt"))
    assert peer.peer == (1, "ValueError: sample 120 is corrupt")
    got = first_cause([peer])
    assert (got.rank, got.kind, got.message) == (1, "ValueError", "sample 120 is corrupt")
    assert str(got) == "rank 1 raised ValueError: sample 120 is corrupt"


def test_a_ranks_own_error_wins_over_a_peers_whichever_arrived_first():
    peer = _as_sent(0, PeerFailed(0, 1, "ValueError: x"))
    own = _as_sent(1, KeyError("k"))
    assert first_cause([peer, own]) is not peer and first_cause([peer, own]).rank == 1
    assert first_cause([own, peer]).kind == "KeyError"


def test_peer_failed_survives_pickle_with_its_fields():
    exc = pickle.loads(pickle.dumps(PeerFailed(2, 0, "RuntimeError: boom")))
    assert (exc.rank, exc.peer, exc.cause) == (2, 0, "RuntimeError: boom")
    assert str(exc) == "rank 2: stopped because rank 0 failed: RuntimeError: boom"


def test_only_a_ranks_own_raise_skips_the_wait_for_a_lost_worker():
    own = _as_sent(1, ValueError("sample 120 is corrupt"))
    assert own.own_error
    comm = _as_sent(0, RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert not comm.own_error  # a peer's worker may have died: the driver looks for it
    assert not _as_sent(0, PeerFailed(0, 1, "ValueError: x")).own_error
    killed = RankFailure(0, "?", "KilledWorker", "attempted to run task on 2 workers")
    killed.from_dask = True
    assert not killed.own_error
