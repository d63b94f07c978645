"""Launch on Dask: the Lab that owns the notebook's cluster, and the Runs it starts on it."""

from distlab.launch.lab import Lab
from distlab.launch.run import Run

__all__ = ["Lab", "Run"]
