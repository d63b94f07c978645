"""Fuzzing: whatever the input, parsing a strategy raises nothing but StrategyError; valid ones round-trip."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import distlab as dl
from distlab.errors import StrategyError
from distlab.strategy.parse import _parse, check, parse_strategy, parse_strategy_json

PROFILE = dl.ModelProfile.from_variables(
    [("emb.weight", (50, 4), "float32", True), ("fc.weight", (6, 4)), ("fc.bias", (6,)), ("s", ())],
    name="fuzz",
)
RESOURCES = dl.ResourceSpec.from_autodist(
    {"nodes": [{"address": "a", "gpus": [0, 1]}, {"address": "b", "gpus": [0, 1]}]}
)
VALID = [c.to_dict() for c in dl.strategy.candidates(PROFILE, RESOURCES)]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-10, 10)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.sampled_from(["allreduce", "ps", "gossip", "allgather", "exp2", "fc.bias", "gpu:0", "none", "fp16"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def only_strategy_errors(fn, *args):
    """Call fn; a StrategyError is fine, any other exception fails the test."""
    try:
        return fn(*args)
    except StrategyError as exc:
        assert "\n" not in str(exc)
        return None


def strict(d, profile=None):
    """The parser without its last-resort net, so the fuzzer finds real gaps in the checks."""
    return check(_parse(d), profile)


@FUZZ
@given(json_values)
def test_random_json_values(value):
    for fn in (parse_strategy, strict):
        only_strategy_errors(fn, value)
        only_strategy_errors(fn, value, PROFILE)
    only_strategy_errors(parse_strategy_json, json.dumps(value))


@FUZZ
@given(st.text(max_size=60) | st.binary(max_size=30))
def test_random_text(text):
    only_strategy_errors(parse_strategy_json, text)


def _paths(x, prefix=()):
    yield prefix
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _paths(v, prefix + (i,))


@FUZZ
@given(st.data())
def test_mutations_of_valid_strategies(data):
    d = copy.deepcopy(data.draw(st.sampled_from(VALID)))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(d) if p]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = data.draw(json_values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=6))] = data.draw(json_values)
        else:
            parent.append(data.draw(json_values))
    for fn in (parse_strategy, strict):
        only_strategy_errors(fn, d)
        only_strategy_errors(fn, d, PROFILE)


@FUZZ
@given(
    st.sampled_from(["AllReduce", "PartitionedAR", "RandomAxisPartitionAR", "Parallax", "PSLoadBalancing"]),
    st.integers(1, 5),
    st.integers(0, 9),
    st.sampled_from([None, 1, 64]),
)
def test_built_strategies_round_trip_exactly(name, chunk, seed, batch_size):
    opts = {"batch_size": batch_size}
    if name != "PSLoadBalancing":
        opts["chunk_size"] = chunk
    if name == "RandomAxisPartitionAR":
        opts["seed"] = seed
    s = dl.strategy.build(name, PROFILE, RESOURCES, **opts)
    assert dl.Strategy.from_json(s.to_json(), PROFILE) == s
    assert dl.Strategy.from_json(s.to_json(indent=None)) == s


@pytest.mark.parametrize("d", VALID, ids=lambda d: d["builder"]["name"])
def test_every_candidate_passes_the_strict_parser(d):
    assert strict(d, PROFILE).to_dict() == d
