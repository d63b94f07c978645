"""g(s), the statistical cost of staleness, measured on the user's own model and data by a short
probe (``Lab.probe_staleness``): a run per staleness, steps to a target loss over the synchronous
run's (costmodel/consistency.statistical_cost). Goodput = throughput / g(s) then ranks the
consistencies (``consistency.price(g=...)``, ``CostModel.rank(staleness_cost=...)``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from distlab.cluster.interrupts import interrupts_held
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
    probe under the conditions the runs will have). The kernel's interrupt cancels the run in
    flight on every worker (within seconds, its ranks aborted if they do not stop at once), starts
    no further run and raises ``KeyboardInterrupt``."""
    from distlab.costmodel.consistency import statistical_cost

    if steps < 10:
        raise LaunchError(f"steps: {steps} is too few to smooth a loss; probe with 10 or more")
    chosen = list(dict.fromkeys([0, *(staleness_key(s) for s in staleness)]))
    runs = {}
    bar = _ProbeBar(steps * len(chosen))
    try:
        for i, s in enumerate(chosen):
            st = build(consistency_options(s))
            run = launch(model, st, steps=steps, data=data, elastic=False, block=False, **launch_options)
            runs[s] = _wait(run, bar, f"staleness {s} (run {i + 1} of {len(chosen)})").metrics
    finally:
        bar.close()
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


def _wait(run: Any, bar: _ProbeBar, what: str) -> Any:
    """Wait for one of the probe's runs, its steps on the probe's bar; raise its error if it failed.
    The kernel's interrupt here cancels it at once (``_cancel_now``) and ends the probe."""
    if not hasattr(run, "join"):  # a stand-in launch that returns finished records (unit tests')
        return run
    done_before = bar.n
    try:
        while not run.join(0.1):
            bar.show(done_before + run.steps_done, what)
    except KeyboardInterrupt:
        with interrupts_held(reraise=False):  # a second press must not leave the run's ranks running
            _cancel_now(run)
        raise KeyboardInterrupt(
            f"staleness probe interrupted: run {run.id} cancelled on every worker; no further run started"
        ) from None
    bar.show(done_before + run.steps, what)
    return run.wait(progress=False)


def _cancel_now(run: Any, within: float = 10.0) -> None:
    """Cancel ``run`` (its ranks aborted if they have not stopped ``spmd.CANCEL_ABORT_AFTER`` s
    after the stop: a cancel alone would let them agree on a step several steps ahead, a stale
    run's staleness plus two, a minute of a model whose step takes seconds)."""
    run.cancel(timeout=within)


class _ProbeBar:
    """The probe's progress: one bar over every run's steps, shown after a second (as run.wait's)."""

    def __init__(self, total: int) -> None:
        self.total, self.n = total, 0
        self._bar: Any = None
        self._since = time.monotonic()

    def show(self, n: int, what: str) -> None:
        self.n = n
        if self._bar is None and time.monotonic() - self._since > 1.0:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, desc="staleness probe", unit="step", leave=False)
        if self._bar is not None and (self._bar.n != n or self._bar.postfix != what):
            self._bar.n = n
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def staleness_key(s: Any) -> Any:
    """A staleness as the probe's result keys it, the key ``convergence.key_of`` gives a plan: an
    integer, or ``"async"`` (also for ``None``, the builders' asynchronous staleness)."""
    consistency_options(s)  # refuses anything else, in one line
    return ASYNC_NAME if s is None else s


def probe_on(
    launch: Callable[..., Any],
    resources: Any,
    model: Any,
    data: Any,
    staleness: Any,
    steps: int,
    builder: str,
    batch_size: int | None,
    launch_options: dict[str, Any],
) -> dict[Any, float]:
    """``lab.probe_staleness``: ``builder`` built for ``resources`` at each staleness, then ``probe``."""
    from distlab import strategy as strategies
    from distlab.keras_model import as_module
    from distlab.runs.validate import variables_profile

    prof = variables_profile(as_module(model))  # names and shapes: what a builder places

    def build(options: dict[str, Any]) -> Any:
        sized = {"batch_size": batch_size} if batch_size else {}
        return strategies.build(builder, prof, resources, servers="all", **sized, **options)

    return probe(launch, build, model, data, staleness, steps, **launch_options)
