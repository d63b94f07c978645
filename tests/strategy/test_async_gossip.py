"""Asynchronous gossip in the strategy format (version 3): the builder's options, what a file
reads and writes, and one line for each thing it refuses."""

from __future__ import annotations

import json

import pytest

import distlab as dl
from distlab.errors import StrategyError
from distlab.resources import ResourceSpec


def test_the_builder_makes_push_sum_by_default_and_neighbour_averaging_on_request(mlp):
    res = ResourceSpec.local(workers=4)
    s = dl.strategy.build("Gossip", mlp, res, asynchronous=True)
    assert s.gossip.asynchronous and s.gossip.mode == "push_sum"
    assert "asynchronous=True" in s.name
    avg = dl.strategy.build("Gossip", mlp, res, asynchronous=True, mode="average", topology="one_peer_exp2")
    assert avg.gossip.mode == "average" and avg.gossip.dynamic
    assert dl.strategy.build("Gossip", mlp, res).gossip == dl.strategy.types.GossipConfig(
        "exp2", False, "atc"
    )


def test_an_asynchronous_plan_round_trips_and_older_versions_read_as_synchronous(mlp):
    s = dl.strategy.build("Gossip", mlp, ResourceSpec.local(workers=4), asynchronous=True)
    d = json.loads(s.to_json())
    assert d["version"] == 3 and d["gossip"]["asynchronous"] is True
    assert dl.Strategy.from_json(s.to_json()) == s
    d["version"] = 2
    del d["gossip"]["asynchronous"]
    d["gossip"]["mode"] = "atc"
    old = dl.Strategy.from_dict(d)
    assert not old.gossip.asynchronous and "asynchronous" not in json.loads(old.to_json())["gossip"]


@pytest.mark.parametrize(
    "change,field,words",
    [
        (lambda d: d["gossip"].update(mode="atc"), "gossip.mode", "not an asynchronous gossip mode"),
        (
            lambda d: d["gossip"].update(asynchronous=False, mode="push_sum"),
            "gossip.mode",
            "not a synchronous",
        ),
        (lambda d: d["gossip"].update(asynchronous="yes"), "gossip.asynchronous", "true or false"),
        (lambda d: d.update(version=2), "gossip.asynchronous", "write version 3"),
        (
            lambda d: d["variables"][0].update(sync={"kind": "allreduce"}),
            "variables[0].sync.kind",
            "every variable",
        ),
    ],
)
def test_a_bad_asynchronous_gossip_file_gets_one_line_naming_its_field(mlp, change, field, words):
    d = json.loads(
        dl.strategy.build("Gossip", mlp, ResourceSpec.local(workers=4), asynchronous=True).to_json()
    )
    change(d)
    with pytest.raises(StrategyError) as info:
        dl.Strategy.from_dict(d)
    msg = str(info.value)
    assert field in msg and words in msg and "\n" not in msg, msg


def test_the_builder_refuses_what_asynchronous_gossip_cannot_do(mlp, recsys):
    res = ResourceSpec.local(workers=4)
    with pytest.raises(StrategyError, match="not an asynchronous mode; use one of: push_sum, average"):
        dl.strategy.build("Gossip", mlp, res, asynchronous=True, mode="awc")
    with pytest.raises(StrategyError, match="needs a collective every step"):
        dl.strategy.build("Gossip", mlp, res, asynchronous=True, sparse="ps")
    assert any(v.sparse for v in recsys.variables)  # the fixture has the sparse table the refusal is about
    with pytest.raises(StrategyError, match="has sparse gradients"):
        dl.strategy.build("Gossip", recsys, res, asynchronous=True)
