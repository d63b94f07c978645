"""Fixtures for strategy tests: small synthetic profiles and two AutoDist resource specs from YAML."""

from __future__ import annotations

import pytest

from distlab import ModelProfile, ResourceSpec

ONE_NODE = """
nodes:
  - address: 10.0.0.1
    gpus: [0, 1]
    chief: true
"""

TWO_NODES = """
nodes:
  - address: 10.0.0.1
    gpus: [0, 1]
    chief: true
    network_bandwidth: 25
  - address: 10.0.0.2
    gpus: [0, 1]
    network_bandwidth: 25
"""


@pytest.fixture
def one_node(tmp_path) -> ResourceSpec:
    """One node with 2 GPUs: ranks 0, 1."""
    path = tmp_path / "one.yml"
    path.write_text(ONE_NODE)
    return ResourceSpec.from_yaml(path)


@pytest.fixture
def two_nodes(tmp_path) -> ResourceSpec:
    """Two nodes with 2 GPUs each: ranks 0, 1 on 10.0.0.1 and 2, 3 on 10.0.0.2."""
    path = tmp_path / "two.yml"
    path.write_text(TWO_NODES)
    return ResourceSpec.from_yaml(path)


@pytest.fixture(params=["one_node", "two_nodes"])
def resources(request) -> ResourceSpec:
    return request.getfixturevalue(request.param)


@pytest.fixture
def mlp() -> ModelProfile:
    """Dense only: float32, so bytes = 4 * numel."""
    return ModelProfile.from_variables(
        [
            ("fc1.weight", (64, 32), "float32", False),  # 8192 B, dim0 64 -> 2 shards
            ("fc1.bias", (64,), "float32", False),  # 256 B
            ("fc2.weight", (15, 64), "float32", False),  # 3840 B, dim0 15 -> 3 shards
            ("fc2.bias", (1,), "float32", False),  # dim0 1: never split
            ("scale", (), "float32", False),  # scalar: never split
        ],
        name="mlp",
    )


@pytest.fixture
def recsys() -> ModelProfile:
    """An embedding with sparse gradients, a dense embedding and dense layers."""
    return ModelProfile.from_variables(
        [
            ("emb.weight", (1000, 16), "float32", True),
            ("pos_emb.weight", (7, 16), "float32", False),
            ("fc.weight", (16, 16), "float32", False),
            ("fc.bias", (16,), "float32", False),
        ],
        name="recsys",
    )
