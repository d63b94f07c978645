"""distlab.notebook: what the user sees and types in Jupyter.

``magics`` is ``%distlab`` (one method per subcommand, its docstring the help), over the
notebook's ``session`` (its Lab, profiles, remembered inputs and runs); ``picker``,
``picker_charts`` and ``picker_launch`` the strategy-picker widget; ``live`` a run's live card
and figure; ``timeline`` a traced run's per-rank timeline; ``plots``, ``figures`` and ``views``
the charts and tables (plotly JSON, themed); ``ranking`` the simulated ranking as a table;
``execute`` runs a notebook headless (papermill).
"""
