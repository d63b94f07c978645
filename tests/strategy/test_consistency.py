"""AutoDist's PS consistency (sync, staleness, local_replication): builders take it, the JSON
(version 2) carries it and reads version 1, and each fault is one StrategyError naming the field."""

from __future__ import annotations

import json

import pytest

import distlab as dl
from distlab.errors import StrategyError
from distlab.strategy import Strategy


@pytest.mark.parametrize("builder", ["PS", "PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS"])
def test_every_ps_builder_takes_the_consistency_and_the_json_round_trips(recsys, two_nodes, builder):
    st = dl.strategy.build(builder, recsys, two_nodes, staleness=2, local_replication=True)
    syncs = [s for p in st.variables for s in p.syncs]
    assert {(s.sync, s.staleness, s.local_replication) for s in syncs} == {(True, 2, True)}
    assert (
        st.consistency == (True, 2)
        and st.stale
        and st.name == f"{builder}(local_replication=True,staleness=2)"
    )
    again = Strategy.from_json(st.to_json(), recsys)
    assert again == st and again.to_dict()["version"] == dl.strategy.types.STRATEGY_VERSION
    assert dl.strategy.build(builder, recsys, two_nodes, sync=False).consistency == (False, 0)
    assert not dl.strategy.build(builder, recsys, two_nodes).stale


def test_parallax_gives_its_ps_part_the_consistency_and_refuses_it_without_one(recsys, mlp, two_nodes):
    st = dl.strategy.build("Parallax", recsys, two_nodes, staleness=1)
    kinds = {s.kind: s for p in st.variables for s in p.syncs}
    assert kinds["ps"].staleness == 1 and kinds["allreduce"].staleness == 0
    with pytest.raises(
        StrategyError, match="Parallax: staleness applies to PS variables and profile 'mlp' has none"
    ):
        dl.strategy.build("Parallax", mlp, two_nodes, staleness=1)
    with pytest.raises(StrategyError, match="Parallax: local_replication applies to PS variables"):
        dl.strategy.build("Parallax", mlp, two_nodes, local_replication=True)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"staleness": -1}, "PS: staleness must be an integer >= 0, got -1"),
        (
            {"staleness": 2, "sync": False},
            "PS: staleness=2 with sync=False; staleness bounds a synchronous PS",
        ),
        ({"sync": "no"}, "PS: sync must be True or False"),
        ({"staleness": 1.5}, "PS: staleness must be an integer >= 0"),
    ],
)
def test_bad_builder_consistency_is_one_line(recsys, two_nodes, options, match):
    with pytest.raises(StrategyError, match=match):
        dl.strategy.build("PS", recsys, two_nodes, **options)


def _doc(recsys, two_nodes) -> dict:
    return dl.strategy.build("PSLoadBalancing", recsys, two_nodes, staleness=1).to_dict()


def _err(d) -> str:
    with pytest.raises(StrategyError) as info:
        Strategy.from_json(json.dumps(d))
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_version_1_file_reads_as_synchronous_ps_and_writes_version_1(recsys, two_nodes):
    d = dl.strategy.build("PS", recsys, two_nodes).to_dict()
    d["version"] = 1
    for v in d["variables"]:
        for k in ("sync", "staleness", "local_replication"):
            del v["sync"][k]
    st = Strategy.from_dict(d)
    assert st.consistency == (True, 0) and st.version == 1 and st.to_dict() == d


def test_json_consistency_faults_name_the_field(recsys, two_nodes):
    d = _doc(recsys, two_nodes)
    d["variables"][0]["sync"]["staleness"] = -2
    assert _err(d).startswith("variables[0].sync.staleness: must be >= 0")
    d = _doc(recsys, two_nodes)
    for v in d["variables"]:
        v["sync"]["sync"] = False
    assert "variables[0].sync.staleness: 1 with sync false" in _err(d)
    d = _doc(recsys, two_nodes)
    d["variables"][2]["sync"]["staleness"] = 3
    assert "variables[2].sync.staleness: sync true, staleness 3 here but sync true, staleness 1" in _err(d)
    d = _doc(recsys, two_nodes)
    d["variables"][0]["sync"]["local_replication"] = "yes"
    assert _err(d) == "variables[0].sync.local_replication: expected true or false, got str"
    d = _doc(recsys, two_nodes)
    d["version"] = 1
    assert _err(d) == "variables[0].sync.sync: version 1 has no sync; write version 2"
    d = dl.strategy.build("AllReduce", recsys, two_nodes).to_dict()
    d["variables"][0]["sync"]["staleness"] = 1
    assert "variables[0].sync.staleness: only a ps sync has a consistency" in _err(d)


@pytest.mark.parametrize(
    "options, field",
    [
        ({"staleness": 2}, "staleness=2"),
        ({"sync": False}, "sync=False"),
        ({"sync": False, "local_replication": True}, "local_replication=True"),
    ],
)
def test_the_native_tensorflow_route_refuses_a_consistency_it_does_not_run(
    recsys, two_nodes, options, field, monkeypatch
):
    """TensorFlow's ParameterServerStrategy has no staleness, sync or proxy setting: a stale or
    asynchronous plan on backend="tensorflow" would train TensorFlow's own way without a word. A
    pure check: a stand-in for a Keras model, no TensorFlow started."""
    import importlib.util

    from distlab.errors import LaunchError
    from distlab.native_tf.launch import check_native

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed: check_native refuses before the strategy")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    keras_like = type(
        "Sequential", (), {"__module__": "keras.src.models.sequential", "trainable_variables": []}
    )
    check_native(keras_like(), dl.strategy.build("PS", recsys, two_nodes))  # synchronous PS: runs natively
    st = dl.strategy.build("PS", recsys, two_nodes, **options)
    with pytest.raises(LaunchError, match=rf"asks for {field}, .* run it with backend='torch'$") as err:
        check_native(keras_like(), st)
    assert "\n" not in str(err.value) and st.name in str(err.value)
