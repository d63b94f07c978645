"""distlab.runs: what a launch makes and reports.

``prepare`` and ``validate`` check and profile a launch's model, data, loss and strategy before
anything starts; ``run`` is the ``Run`` handle (its driver thread, live records, cancel, resize,
the trained model); ``train`` is the task each rank runs on its worker; ``metrics`` the records
as a table and the throughput measured from them; ``report`` a run's row and card; ``forecast``
the Lab's prediction for a run and the refit after it; ``adaptive`` an adaptive-batch run's
table of configurations; ``replan`` a strategy re-planned for the workers that survive;
``staleness`` the short probe that measures g(s), staleness's statistical cost;
``route`` the interface both routes (distlab/torch_route.py, native_tf/route.py) implement.
"""
