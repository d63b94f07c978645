"""The cluster measures the model it will run: a user's own model's step on the workers, cached per model and
cluster."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


class GRULM(torch.nn.Module):
    """A model from outside the zoo: ids -> per-position logits, no input_spec."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.rnn = torch.nn.GRU(16, 32, batch_first=True)
        self.out = torch.nn.Linear(32, 100)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(self.emb(ids))[0])


def test_a_model_outside_the_zoo_is_measured_once_then_read_from_the_cache(
    clean_lab, tmp_path, monkeypatch, load_ignored
):
    import distlab as dl
    from distlab.costmodel.compute import model_key
    from distlab.runs.validate import variables_profile

    clean_lab.cache_dir = tmp_path
    clean_lab.cost_model = None
    model = GRULM()
    cm = clean_lab.measure_model(
        model, batch_size=8, progress=False
    )  # its data inferred from its first layer
    key = model_key(variables_profile(model))
    cores = clean_lab.resources.cores[clean_lab.resources.ranks[0].host]
    assert cm.compute.measured(key) == [(1, cores), (2, cores)] and clean_lab.cost_model is cm
    assert sorted({r["batch"] for r in cm.compute.to_rows()}) == [2, 8]
    assert len(list(tmp_path.glob("local-steps-*.json"))) == 1
    # predictions for it now use the measured step, not the profile scaled by the contention model
    prof = dl.profile(model, batch_size=8)
    st = dl.strategy.build("AllReduce", prof, clean_lab.resources, batch_size=8)
    measured = cm.predict(prof, clean_lab.resources, st).breakdown["compute"]
    assert measured != dl.CostModel.default().predict(prof, clean_lab.resources, st).breakdown["compute"]

    clean_lab.cost_model = None  # a new session on this cluster: read from the cache, nothing runs
    calls = []
    monkeypatch.setattr(clean_lab.cluster, "run_ranks", lambda *a, **k: calls.append(a) or [])
    again = clean_lab.measure_model(GRULM(), batch_size=8, progress=False)
    assert calls == [] and again.compute.to_rows() == cm.compute.to_rows()


def test_a_model_distlab_cannot_feed_names_the_fix(clean_lab, tmp_path):
    from distlab.errors import CalibrationError

    class TakesADict(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3))

        def forward(self, batch):
            return batch["x"] * self.w

    clean_lab.cache_dir = tmp_path
    with pytest.raises(CalibrationError, match=r"TakesADict.*pass \(takesadict, dataset\)"):
        clean_lab.measure_model(TakesADict(), progress=False)
    assert list(tmp_path.glob("*")) == []
