"""lab.calibrate() repeats its noisy stages, shows their spread, and does not cache one that differs."""

from __future__ import annotations

import warnings

import pytest

from tests.calibrations import two_reference_models

# one calibration of the 2-worker Lab: 238 s with the fixture's Lab, measured beside a load average of 15
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
SIZES = [4096, 65536]


def test_a_calibration_whose_repeats_disagree_serves_the_session_but_is_not_cached(
    clean_lab, tmp_path, monkeypatch, load_ignored
):
    from distlab.calibration import repeat
    from distlab.cluster.load import CalibrationWarning

    clean_lab.cache_dir = tmp_path
    # no real cluster repeats exactly: with no spread allowed, every calibration is refused
    monkeypatch.setattr(repeat, "REPEAT_LIMIT", 0.0)
    with warnings.catch_warnings(record=True) as caught, two_reference_models():
        warnings.simplefilter("always")
        cm = clean_lab.calibrate(sizes=SIZES, progress=False)
    spreads = {d["stage"]: d for d in cm.fingerprint["repeatability"]}
    assert {"collectives", "training loop"} <= set(spreads)
    assert spreads["collectives"]["repeats"] == repeat.LINK_REPEATS and spreads["collectives"]["figures"] >= 5
    assert all(d["spread"] > 0 for d in spreads.values())
    refused = [str(w.message) for w in caught if issubclass(w.category, CalibrationWarning)]
    assert len(refused) == 1 and "stage did not repeat" in refused[0] and "not cached" in refused[0]
    assert cm.fingerprint["unrepeatable"]["stage"] in spreads
    assert "repeats within" in repr(cm) and "<b>Not cached</b>" in cm._repr_html_()
    assert clean_lab.cost_model is cm  # it serves the session
    assert not list(tmp_path.glob("calibration-*.json"))  # and is not cached
