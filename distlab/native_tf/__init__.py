"""distlab.native_tf: the TensorFlow route (``lab.launch(..., backend="tensorflow")``).

A Keras model runs in TensorFlow's own multi-worker runtime: ``route`` is the route the Lab
picks for ``backend="tensorflow"`` (runs/route.py); ``launch`` checks and starts a
native run (MultiWorkerMirroredStrategy for AllReduce, ParameterServerStrategy for the PS
family); ``rank`` is each rank's Dask task, which starts ``child.py`` (a fresh process that
imports TensorFlow and nothing of distlab) and relays its records; ``calibrate`` measures
TensorFlow's side of the cost model (``costmodel/native.py``). Importing this package imports
no TensorFlow.
"""
