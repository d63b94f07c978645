"""Strategy JSON: exact round trip, and one StrategyError naming the field for each kind of fault."""

from __future__ import annotations

import copy
import json

import pytest

import distlab as dl
from distlab.errors import StrategyError
from distlab.strategy import Strategy, Sync, VariablePlan, validate


@pytest.fixture
def doc(recsys, two_nodes) -> dict:
    """A valid PartitionedPS strategy as a dict, to break one field at a time."""
    d = dl.strategy.build("PartitionedPS", recsys, two_nodes).to_dict()
    d["variables"][3] = {"name": "fc.bias", "sync": {"kind": "ps", "server": 2}}
    return d


def err(d, profile=None) -> str:
    with pytest.raises(StrategyError) as info:
        Strategy.from_json(json.dumps(d), profile)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_issue_example_parses(recsys):
    text = """{"version": 1,
     "builder": {"name": "PartitionedPS", "options": {}},
     "ranks": [{"rank": 0, "host": "10.0.0.1", "device": "gpu:0"},
               {"rank": 1, "host": "10.0.0.1", "device": "gpu:1"},
               {"rank": 2, "host": "10.0.0.2", "device": "gpu:0"}],
     "servers": [0, 2], "backend": "auto",
     "batch": {"per_replica": 32, "accumulation": 1, "lr_scaling": "none"},
     "gossip": null,
     "variables": [
       {"name": "emb.weight", "sync": {"kind": "ps", "server": 0}},
       {"name": "fc.weight", "sync": {"kind": "allreduce", "group": 0, "compressor": "none"}},
       {"name": "pos_emb.weight", "partition": {"axis": 0, "shards": 2},
        "shards": [{"sync": {"kind": "ps", "server": 0}}, {"sync": {"kind": "ps", "server": 2}}]},
       {"name": "fc.bias", "sync": {"kind": "allreduce", "group": 0, "compressor": "fp16"}}
     ]}"""
    with pytest.raises(
        StrategyError, match=r"variables\[3\].sync.compressor: group 0 mixes 'fp16' with 'none'"
    ):
        Strategy.from_json(text)
    s = Strategy.from_json(text.replace('"fp16"', '"none"'), recsys)
    assert s.plan("pos_emb.weight").partition.shards == 2
    assert s.plan("emb.weight").sync == Sync("ps", server=0)


def test_round_trip_is_exact_and_save_load(recsys, two_nodes, tmp_path):
    for c in dl.strategy.candidates(recsys, two_nodes):
        assert Strategy.from_json(c.to_json(indent=None)) == c
    s = dl.strategy.build("Gossip", recsys, two_nodes, topology="ring", mode="awc", batch_size=4)
    assert Strategy.load(s.save(tmp_path / "s.json"), recsys) == s


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda d: d["variables"][0]["shards"][0]["sync"].update(server=7),
            r"variables\[0\].shards\[0\].sync.server: rank 7 does not exist \(4 ranks\)",
        ),
        (
            lambda d: d["variables"][2]["shards"][0]["sync"].update(kind="broadcast"),
            r"variables\[2\].shards\[0\].sync.kind: 'broadcast' is not one of: "
            r"allreduce, ps, allgather, gossip",
        ),
        (
            lambda d: d["variables"][3].update(sync={"kind": "ps", "server": 1}),
            r"variables\[3\].sync.server: rank 1 is not in servers \[0, 2\]",
        ),
        (
            lambda d: d["variables"][3].update(sync={"kind": "ps", "server": 0, "compressor": "fp16"}),
            r"variables\[3\].sync.compressor: only allreduce compresses",
        ),
        (
            lambda d: d["variables"][0]["shards"].pop(),
            r"variables\[0\].shards: 1 entries for partition.shards 2",
        ),
        (
            lambda d: d["variables"].append(copy.deepcopy(d["variables"][1])),
            r"variables\[4\].name: 'pos_emb.weight' repeated \(first at variables\[1\]\)",
        ),
        (lambda d: d.update(version=4), "version: 4 is newer"),
        (lambda d: d.update(backend="mpi"), "backend: 'mpi' is not one of: auto, gloo, nccl"),
        (lambda d: d.update(colour="red"), "strategy: unknown key 'colour'"),
        (lambda d: d.pop("ranks"), "ranks: missing"),
        (lambda d: d["ranks"][1].update(rank=5), r"ranks\[1\].rank: expected 1"),
        (
            lambda d: d["ranks"][1].update(device="tpu:0"),
            r"ranks\[1\].device: 'tpu:0' is not 'cpu:N' or 'gpu:N'",
        ),
        (lambda d: d["batch"].update(per_replica=0), "batch.per_replica: must be >= 1, got 0"),
        (lambda d: d["batch"].update(per_replica=True), "batch.per_replica: expected an integer"),
        (lambda d: d["servers"].append(9), r"servers\[2\]: rank 9 does not exist"),
        (
            lambda d: d["variables"][3].update(sync={"kind": "gossip"}),
            r"variables\[3\].sync.kind: gossip sync needs the global 'gossip'",
        ),
        (lambda d: d.update(gossip={"topology": "torus"}), "gossip.topology: 'torus' is not known"),
        (
            lambda d: d.update(gossip={"topology": "one_peer_exp2", "dynamic": False}),
            "gossip.dynamic: topology 'one_peer_exp2' is dynamic",
        ),
        (lambda d: d["variables"][3].pop("sync"), r"variables\[3\].sync: missing"),
        (
            lambda d: d["variables"][0]["partition"].update(shards=1),
            r"variables\[0\].partition.shards: must be >= 2",
        ),
    ],
)
def test_structural_errors_name_the_field(doc, edit, message):
    Strategy.from_dict(doc)  # valid before the edit
    edit(doc)
    err(doc)  # one line
    with pytest.raises(StrategyError, match=message):
        Strategy.from_dict(doc)


def test_profile_errors(doc, recsys):
    d = copy.deepcopy(doc)
    d["variables"].pop(2)
    assert err(d, recsys) == "variables: 'fc.weight' from profile 'recsys' has no plan"
    d = copy.deepcopy(doc)
    d["variables"][3]["name"] = "head.bias"
    assert err(d, recsys) == "variables[3].name: 'head.bias' is not a variable of profile 'recsys'"
    d = copy.deepcopy(doc)
    d["variables"][2] = {
        "name": "fc.weight",
        "partition": {"axis": 2, "shards": 2},
        "shards": d["variables"][0]["shards"],
    }
    assert err(d, recsys) == "variables[2].partition.axis: 2 out of range for shape [16, 16]"
    d["variables"][2]["partition"] = {"axis": 1, "shards": 17}
    d["variables"][2]["shards"] = [{"sync": {"kind": "ps", "server": 0}}] * 17
    assert err(d, recsys) == "variables[2].partition.shards: 17 shards > dimension 1 of size 16"
    assert Strategy.from_dict(d)  # without a profile: structure only


def test_sparse_variable_on_dense_only_kernel(doc, recsys, two_nodes):
    d = copy.deepcopy(doc)
    d["variables"][0] = {
        "name": "emb.weight",
        "sync": {"kind": "allreduce", "group": 0, "compressor": "none"},
    }
    assert "variables[0].sync.kind: 'emb.weight' has sparse gradients; allreduce is dense-only" in err(
        d, recsys
    )
    d["variables"][0]["sync"] = {"kind": "gossip"}
    d["gossip"] = {"topology": "ring", "dynamic": False, "mode": "atc"}
    assert "gossip is dense-only" in err(d, recsys)
    d["variables"][0]["sync"] = {"kind": "allgather"}
    assert Strategy.from_dict(d, recsys).plan("emb.weight").sync.kind == "allgather"
    d["variables"][2] = {"name": "fc.weight", "sync": {"kind": "allgather"}}
    assert (
        err(d, recsys)
        == "variables[2].sync.kind: allgather moves sparse gradients; 'fc.weight' is dense (use allreduce)"
    )


def test_load_errors(tmp_path):
    with pytest.raises(StrategyError, match="cannot read it"):
        Strategy.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(StrategyError, match=r"not valid JSON \(line 1, column 2"):
        Strategy.load(tmp_path / "bad.json")


def test_validate_constructed_objects(recsys, one_node, two_nodes):
    s = dl.strategy.build("AllReduce", recsys, one_node)
    assert validate(s, recsys, one_node) is s
    with pytest.raises(StrategyError, match="ranks: strategy has 2 ranks, resources 4"):
        validate(s, recsys, two_nodes)
    broken = Strategy(variables=(VariablePlan("fc.weight", sync=Sync("allreduce")),), ranks=s.ranks)
    with pytest.raises(StrategyError, match=r"variables\[0\].sync.group: must be an integer"):
        validate(broken)
    wrong = Strategy(variables=(VariablePlan("fc.weight", sync=Sync("ps", server=5)),), ranks=s.ranks)
    with pytest.raises(StrategyError, match=r"variables\[0\].sync.server: rank 5 does not exist \(2 ranks\)"):
        validate(wrong)
    partial = Strategy(variables=(VariablePlan("fc.weight", sync=Sync("ps", server=1)),), ranks=s.ranks)
    with pytest.raises(StrategyError, match="'emb.weight' and 2 more from profile 'recsys' have no plan"):
        validate(partial, recsys)
