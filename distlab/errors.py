"""The one error type distlab raises on purpose, and its few specialisations."""

from __future__ import annotations

from collections.abc import Iterable


class DistlabError(Exception):
    """Base of every error distlab raises on purpose.

    The message is one line that names the field or object at fault and says what to do.
    """


class ProfileError(DistlabError):
    """A model could not be profiled (bad input, failing forward pass)."""


class StrategyError(DistlabError):
    """A strategy is invalid, or does not fit the model or the resources."""


class ResourceError(DistlabError):
    """A resource specification is invalid."""


class LaunchError(DistlabError):
    """A run could not be started, or failed on the cluster."""


class WindowError(DistlabError):
    """A one-sided window (distlab.runtime.window) was misused, or its peers failed it."""


class CalibrationError(DistlabError):
    """Calibration or cost-model fitting failed."""


class SchedulerError(DistlabError):
    """A scheduling policy's allocation was refused (over capacity, an unknown job or worker), or a
    job or cluster given to the scheduler is invalid; a caller keeps the previous allocation."""


class DistlabWarning(UserWarning):
    """Base of distlab's warnings: one line naming what happened and what to do (in a notebook
    with the magics loaded, shown as one ``distlab:`` line)."""


def _norm(word: str) -> str:
    return word.lower().replace("_", "-")


def match_name(word: str, choices: Iterable[str]) -> str | None:
    """``word`` itself when it is one of ``choices``; else the one choice equal to it ignoring case
    (and ``_`` against ``-``); else None (none, or several: ambiguous)."""
    names = list(choices)
    if word in names:
        return word
    same = [c for c in names if _norm(c) == _norm(word)]
    return same[0] if len(same) == 1 else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'X'?"`` for the nearest of ``choices`` (standard library difflib), else ""."""
    import difflib

    names = list(choices)
    by_norm = {_norm(c): c for c in names}
    near = difflib.get_close_matches(_norm(word), list(by_norm), n=2, cutoff=0.6)
    if not near:
        return ""
    return "; did you mean " + " or ".join(repr(by_norm[n]) for n in near) + "?"


def check_positive(
    name: str, value: object, error: type[Exception] = DistlabError, *, optional: bool = False
) -> int | None:
    """The one positive-integer check: ``value`` when it is an integer >= 1 (a bool is not one),
    None when it is None and ``optional``; else one ``error``: "``name`` must be an integer >= 1,
    got ``value``" (``name`` says where: ``"steps"``, ``"calibrate: batch_size"``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{name} must be an integer >= 1, got {value!r}")
    return value
