"""g(s), the statistical cost of staleness, measured on the user's own model and data by a short
probe (``Lab.probe_staleness``): a run per staleness, steps to a target loss over the synchronous
run's (costmodel/consistency.statistical_cost). Goodput = throughput / g(s) then ranks the
consistencies (``consistency.price(g=...)``, ``CostModel.rank(staleness_cost=...)``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from distlab.errors import LaunchError

ASYNC_NAME = "async"


def consistency_options(s: Any) -> dict[str, Any]:
    """A builder's consistency options for a staleness: an integer >= 0, or ``"async"``."""
    if s == ASYNC_NAME or s is None:
        return {"sync": False}
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise LaunchError(f"staleness: {s!r} is not an integer >= 0 or 'async'")
    return {"staleness": s}


def probe(
    launch: Callable[..., Any],
    build: Callable[[dict[str, Any]], Any],
    model: Any,
    data: Any,
    staleness: Sequence[Any] = (1, 4, ASYNC_NAME),
    steps: int = 60,
    target_at: float = 0.7,
    **launch_options: Any,
) -> dict[Any, float]:
    """Launch ``model`` for ``steps`` at staleness 0 and at each of ``staleness`` (``build(options)``
    makes the strategy), one after the other; returns g per staleness (0 -> 1.0; ``None`` keyed
    ``"async"``, as ``CostModel.rank`` looks asynchronous plans up). Every run is a real run of the
    Lab (``lab.runs`` lists them); ``launch_options`` go to each launch (``slowdown=``, ``jitter=``:
    probe under the conditions the runs will have)."""
    from distlab.costmodel.consistency import statistical_cost

    if steps < 10:
        raise LaunchError(f"steps: {steps} is too few to smooth a loss; probe with 10 or more")
    chosen = list(dict.fromkeys([0, *(staleness_key(s) for s in staleness)]))
    runs = {}
    for s in chosen:
        st = build(consistency_options(s))
        run = launch(model, st, steps=steps, data=data, elastic=False, block=True, **launch_options)
        runs[s] = run.metrics
    g = statistical_cost(runs, target_at)
    below = {s: v for s, v in g.items() if v < 1.0}
    if below:
        import warnings

        from distlab.errors import DistlabWarning

        said = ", ".join(f"g({s}) = {v:.2f}" for s, v in below.items())
        warnings.warn(
            f"staleness probe: {said} below 1; the ranking counts it as 1 (staleness is not credited "
            "with faster convergence: with Adam each stale push is a full optimizer step, an effective "
            "learning-rate change); probe with optimizer='sgd' to measure staleness alone",
            DistlabWarning,
            stacklevel=3,
        )
    return g


def staleness_key(s: Any) -> Any:
    """A staleness as the probe's result keys it, the key ``convergence.key_of`` gives a plan: an
    integer, or ``"async"`` (also for ``None``, the builders' asynchronous staleness)."""
    consistency_options(s)  # refuses anything else, in one line
    return ASYNC_NAME if s is None else s
