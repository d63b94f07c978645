"""Statistical efficiency and goodput from the gradient noise scale (Pollux, Qiao et al. OSDI 2021; AdaptDL)."""

from __future__ import annotations

import numpy as np


def statistical_efficiency(
    global_batch: np.ndarray | float, noise_scale: float, base_batch: float
) -> np.ndarray:
    """Progress per sample at batch M relative to the base batch M0: ``(phi + M0) / (phi + M)``.

    ``phi`` is the gradient noise scale (McCandlish et al. 2018's B_noise, as AdaptDL measures
    it): batches far below it scale perfectly, batches far above it waste samples.
    """
    m = np.asarray(global_batch, dtype=float)
    return (noise_scale + base_batch) / (noise_scale + m)


def goodput(
    throughput: np.ndarray | float, global_batch: np.ndarray | float, noise_scale: float, base_batch: float
) -> np.ndarray:
    """Throughput times statistical efficiency: useful samples per second."""
    return np.asarray(throughput, dtype=float) * statistical_efficiency(global_batch, noise_scale, base_batch)
