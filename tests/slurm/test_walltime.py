"""The walltime warning at launch: a run predicted to outlast what is left of its Slurm jobs' time
limit is one warning line with both durations; Slurm's time-limit formats; no Slurm needed."""

from __future__ import annotations

import warnings

import pytest

from distlab.cluster.slurm import WalltimeWarning, check_walltime, parse_walltime, predicted_run_seconds
from distlab.errors import DistlabWarning, LaunchError


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 1800),  # minutes
        ("30:15", 1815),  # minutes:seconds
        ("02:00:00", 7200),
        ("1-12", 129_600),  # days-hours
        ("1-00:30", 88_200),
        ("2-00:00:10", 172_810),
    ],
)
def test_slurms_time_limit_formats_are_read_as_sbatch_reads_them(text, seconds):
    assert parse_walltime(text) == seconds


@pytest.mark.parametrize("text", ["1h", "", "1:2:3:4", "-5", "a-01"])
def test_a_walltime_that_is_no_slurm_time_limit_is_one_error_naming_the_field(text):
    with pytest.raises(LaunchError, match=r"walltime=.* is not a Slurm time limit; give 'MM'"):
        parse_walltime(text)


def test_a_run_predicted_to_outlast_the_jobs_walltime_left_is_one_warning_with_both_durations():
    # jobs of 30 minutes that started 20 minutes ago: 10 minutes left; the run needs 20
    predicted = predicted_run_seconds(steps=6000, throughput=80.0, samples_per_step=16)
    assert predicted == 1200.0
    with pytest.warns(WalltimeWarning) as caught:
        text = check_walltime("30", started_at=1000.0, predicted_seconds=predicted, now=1000.0 + 1200)
    (w,) = caught
    assert issubclass(w.category, DistlabWarning) and str(w.message) == text and "\n" not in text
    assert "predicted to take 20 min 00 s" in text and "10 min 00 s of their walltime='30' left" in text
    assert "longer walltime= or fewer steps" in text


@pytest.mark.parametrize(
    "walltime, started, predicted",
    [
        ("30", 1000.0, 500.0),  # fits in the 10 minutes left
        (None, 1000.0, 1e9),  # no walltime asked: the partition's limit, unknown here
        ("30", None, 1e9),  # no job running
        ("30", 1000.0, None),  # no prediction (no cost model, a user's loop)
    ],
)
def test_a_run_that_fits_or_cannot_be_judged_gives_no_warning(walltime, started, predicted):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_walltime(walltime, started, predicted, now=2200.0) is None


def test_no_prediction_is_no_run_time():
    assert predicted_run_seconds(None, 80.0, 16) is None  # a user's loop: its steps are its own
    assert predicted_run_seconds(100, float("nan"), 16) is None
