"""Calibrated, vectorised cost model of data-parallel step time: predict, rank and sweep strategies."""

from distlab.costmodel.model import CostModel
from distlab.costmodel.params import CostParams
from distlab.costmodel.prediction import Prediction

__all__ = ["CostModel", "CostParams", "Prediction"]
