"""dl.profile of Keras 3 models under both backends: the same ModelProfile as for torch."""

from __future__ import annotations

import pytest
from keras_scripts import TIMEOUT, result

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT + 60)]  # the first test waits for them all
BACKENDS = ["tensorflow", "torch"]


@pytest.fixture(scope="module", params=BACKENDS)
def facts(request):
    """The profiles' facts from the process of each notebook backend (conftest.py)."""
    return result(request.getfixturevalue(f"{request.param}_notebook"), "profile")


def test_a_dense_layer_counts_exactly_two_b_in_out(facts):
    layers = {name: (kind, fwd, bwd, params) for name, kind, fwd, bwd, params in facts["layers"]}
    b = 8
    assert layers["dense"] == ("Dense", 2 * b * 12 * 32, 2 * 2 * b * 12 * 32, 12 * 32 + 32)
    assert layers["dense_1"] == ("Dense", 2 * b * 32 * 5, 2 * 2 * b * 32 * 5, 32 * 5 + 5)


def test_variables_by_keras_path_and_gradients_ready_from_the_last_layer(facts):
    names = [v[0] for v in facts["variables"]]
    assert names == ["dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]
    assert facts["grad_ready_order"][:2] == ["dense_1/bias", "dense_1/kernel"]
    assert sorted(facts["grad_ready_order"]) == sorted(names)


def test_the_step_is_measured_and_split_over_the_layers(facts):
    assert facts["step_time"] > 0
    assert facts["layer_time_sum"] == pytest.approx(facts["step_time"], rel=1e-6)


def test_an_embedding_table_is_an_embedding_and_sparse_where_its_gradient_is(facts):
    table = [v for v in facts["emb_variables"] if v[0] == "table/embeddings"]
    assert table, facts["emb_variables"]
    _, sparse, embedding = table[0]
    assert embedding
    # TensorFlow hands an Embedding's gradient over as IndexedSlices; under torch it is dense
    assert sparse == (facts["backend"] == "tensorflow")
    assert dict((n, f) for n, _, f in facts["emb_layers"])["table"] == 0
    assert facts["input_spec"]["dtype"] == "int32" and facts["input_spec"]["shape"] == [6]
