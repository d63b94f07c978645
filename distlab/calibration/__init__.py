"""distlab.calibration: measuring a cluster for the cost model (``costmodel/calibrate.py`` fits).

``campaign`` runs a whole calibration on a Lab's cluster (collectives at each size and world,
the training loop, reference models, cached per cluster) and measures a model's own step for
a launch; ``measure`` holds its measurements (the loop and a model's step at every world size,
every rank busy), the progress it reports and their repeats.
"""
