"""Calibrated, vectorised cost model of data-parallel step time: predict, rank and sweep strategies.

``model`` is ``CostModel`` (predict, rank, refit), ``params`` its calibrated figures, ``prediction``
what it returns; ``compile`` turns a strategy into arrays and ``evaluate`` prices many at once;
``collectives``, ``compute``, ``contention``, ``degree`` and ``links`` (the bytes through each host's
link, per phase) the terms; ``calibrate``, ``fit`` and
``refit`` fit the figures to measurements (``distlab/calibration`` takes them); ``rows`` the typed
measurement rows, ``scoring`` how well predictions met runs, ``whatif`` other clusters,
``native`` TensorFlow's own runtime, ``consistency`` stale and asynchronous PS (each rank's clocks),
``gossip_pricing`` gossip on each rank's clock and the consensus distance its topology leaves.
"""

from distlab.costmodel.model import CostModel
from distlab.costmodel.params import CostParams
from distlab.costmodel.prediction import Prediction

__all__ = ["CostModel", "CostParams", "Prediction"]
