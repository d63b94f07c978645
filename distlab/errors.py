"""The one error type distlab raises on purpose, and its few specialisations."""

from __future__ import annotations


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


class CalibrationError(DistlabError):
    """Calibration or cost-model fitting failed."""
