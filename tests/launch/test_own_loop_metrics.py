"""``lab.run``'s ``metrics=``: the names distlab measures on every step of a user's loop, and one line for
one it does not (distlab/own_route.py ``own_metrics``; measured in tests/runtime/test_own_parity.py)."""

from __future__ import annotations

import pytest

from distlab.errors import LaunchError
from distlab.own_route import own_metrics
from distlab.step_metrics import StepMetric


def test_metric_names_become_step_metrics_once_each():
    got = own_metrics(["accuracy", "Mean_Absolute_Error", StepMetric("accuracy")])
    assert got == (StepMetric("accuracy"), StepMetric("mean_absolute_error"))
    assert own_metrics("accuracy") == (StepMetric("accuracy"),)
    assert own_metrics(None) == ()


def test_a_metric_distlab_does_not_measure_is_one_line_naming_it_and_the_fix():
    with pytest.raises(LaunchError, match=r"metrics: 'auc' is not one distlab computes.*ctx\.report"):
        own_metrics(["accuracy", "auc"])
