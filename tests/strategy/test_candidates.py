"""candidates(): every builder with a spread of options, deduplicated, valid, on synthetic and zoo models."""

from __future__ import annotations

import pytest

import distlab as dl
from distlab import ResourceSpec
from distlab.strategy import validate
from distlab.strategy.candidates import plan_key


def test_candidates_cover_every_builder_and_are_distinct(recsys, two_nodes):
    cands = dl.strategy.candidates(recsys, two_nodes)
    assert {c.builder for c in cands} == set(dl.strategy.builders())
    keys = [plan_key(c) for c in cands]
    assert len(set(keys)) == len(keys)
    for c in cands:
        validate(c, recsys, two_nodes)
    topologies = {c.gossip.topology for c in cands if c.gossip}
    assert {"exp2", "ring", "one_peer_exp2", "hierarchical"} <= topologies  # 4 ranks: a power of two
    assert {c.gossip.mode for c in cands if c.gossip} == {"atc", "awc"}
    assert {"fp16", "bf16"} <= {c.options.get("compressor") for c in cands}


def test_identical_plans_are_kept_once(mlp, one_node):
    cands = dl.strategy.candidates(mlp, one_node)
    # 5 variables: chunk sizes 128, 32 and 8 give the same all-reduce plan; the default is kept
    allreduce = [c for c in cands if c.builder == "AllReduce" and "compressor" not in c.options]
    assert [c.options for c in allreduce] == [{}]
    # one server per host on one host: PS and PSLoadBalancing coincide; servers="all" differs, and
    # so do its stale-synchronous and asynchronous variants
    assert [c.options for c in cands if c.builder == "PSLoadBalancing"] == [
        {"servers": "all"},
        {"servers": "all", "staleness": 1},
        {"servers": "all", "staleness": 4},
        {"servers": "all", "sync": False},
    ]


def test_gossip_skipped_at_world_one_and_one_peer_only_for_powers_of_two(recsys):
    assert not any(c.gossip for c in dl.strategy.candidates(recsys, ResourceSpec.local(workers=1)))
    three = {
        c.gossip.topology for c in dl.strategy.candidates(recsys, ResourceSpec.local(workers=3)) if c.gossip
    }
    assert "one_peer_exp2" not in three and "exp2" in three


# Smaller than the zoo defaults (same structure) so profiling stays quick on 2 cores.
SMALL = {
    "mlp": {"width": 64},
    "convnet": {"width": 8},
    "transformer_lm": {"vocab_size": 512, "d_model": 64, "layers": 2, "heads": 2},
    "wide_deep": {"rows": 1000},
}


@pytest.mark.slow  # every zoo model profiled: seconds
@pytest.mark.timeout(240)
def test_candidates_on_every_zoo_model(two_nodes):
    pytest.importorskip("torch")
    zoo = pytest.importorskip("distlab.zoo")
    for name in zoo.names():
        prof = dl.profile(zoo.get(name, **SMALL.get(name, {})), batch_size=4, repeats=1, warmup=0)
        cands = dl.strategy.candidates(prof, two_nodes)
        keys = {plan_key(c) for c in cands}
        assert len(keys) == len(cands), name
        for builder in dl.strategy.builders():  # present, or identical to an earlier plan
            assert plan_key(dl.strategy.build(builder, prof, two_nodes)) in keys, (name, builder)
        for c in cands:
            validate(c, prof, two_nodes)
            assert dl.Strategy.from_json(c.to_json(), prof) == c
