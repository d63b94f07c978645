"""The torch route (``lab.launch(..., backend="torch")``, the default): distlab's own runtime, every
builder, one rank per worker in a torch.distributed process group (runs/route.py: the interface).

A launch prepares the model, data and strategy (runs/prepare.py), measures the model's own step
on the workers when the Lab has a cost model (calibration/campaign.measure_model, cached), and
builds the Run with its forecast and how it replans on the workers that survive a loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distlab.calibration.campaign import calibrate_cluster, measure_model
from distlab.conventions import optimizer_kind
from distlab.runs.forecast import forecast_run
from distlab.runs.prepare import prepare_launch
from distlab.runs.replan import replan as replan_strategy
from distlab.runs.route import LabSide, LaunchRequest, Route
from distlab.runs.run import Forecast, Run
from distlab.runs.train import train_rank
from distlab.runs.validate import check_slowdown_ranks

# a default (elastic) run's checkpoints after its first take at most this share of its time
CHECKPOINT_BUDGET = 0.01

if TYPE_CHECKING:
    from distlab.costmodel.model import CostModel
    from distlab.resources import ResourceSpec
    from distlab.runtime.job import RankJob


def replanner(
    lab: LabSide, job: RankJob, st: Any, model: Any, profile: Callable[[], Any], kind: str | None
) -> Callable[[list[str]], tuple[Any, list[int], dict[str, Any]]]:
    """How a run goes on after a loss (``Run``'s ``replan``): the strategy re-planned for the
    surviving workers (same per-replica batch), their threads, and an adaptive run's controller
    table priced again for them. ``profile()``: the model's profile at the run's batch."""

    def replan(survivors: list[str]) -> tuple[Any, list[int], dict[str, Any]]:
        sub = lab.cluster.resources.of_workers(survivors)
        new = replan_strategy(st, model, sub, profile)
        options = {}
        if job.options.adaptive is not None:
            b = int(job.batch_size or st.batch.per_replica)
            options = adaptive_run_options(lab.cost_model(), profile(), sub, new, b, kind)
        return new, lab.cluster.threads_for(survivors), options

    return replan


class TorchRoute(Route):
    """distlab's runtime: every builder, traced on request, elastic (module docstring)."""

    name = "torch"
    traced = True

    def launch(self, lab: LabSide, request: LaunchRequest) -> tuple[Run, CostModel | None]:
        from distlab.runtime.job import RankJob, RunOptions

        r = request
        res = lab.cluster.resources
        prep = prepare_launch(
            r.model, r.strategy, r.data, r.loss, r.optimizer, r.batch_size, r.seed, res, lab.profiles
        )
        model, data, st, b, profile = prep.model, prep.data, prep.strategy, prep.batch, prep.profile
        check_slowdown_ranks(r.slowdown, st.world)
        cost_model = lab.cost_model()
        if cost_model is not None:  # predict with the model's own step on these workers
            cost_model = measure_model(lab.cluster, lab.cache_dir, cost_model, model, data, r.loss, b)
        workers = lab.cluster.first(st.world, res)
        run_id = lab.hooks.new_id()
        checkpoint_every, budget = r.checkpoint_every, None
        if r.elastic and checkpoint_every is None:  # the first after a tenth; then timed by their cost
            checkpoint_every, budget = max(10, r.steps // 10), CHECKPOINT_BUDGET
        kind = optimizer_kind(r.optimizer)
        job = RankJob.unplaced(
            st,
            model,
            r.steps,
            data,
            loss=r.loss,
            optimizer=r.optimizer,
            batch_size=r.batch_size,
            shuffle=r.shuffle,
            seed=r.seed,
            checkpoint_dir=str(lab.checkpoint_dir / run_id) if checkpoint_every else None,
            checkpoint_every=checkpoint_every,
            checkpoint_budget=budget,
            timeout=float(r.timeout or lab.cluster.timeout),
            run_id=run_id,
            # torch's DDP reducer where it applies (strategy/execution.py; the cost model prices it)
            options=RunOptions(
                ddp=True,
                trace=r.trace,
                metrics=r.metrics,
                slowdown=r.slowdown,
                jitter=r.jitter,
                **adaptive_run_options(cost_model, profile(b), res, st, b, kind),
            ),
        )

        run = Run(
            lab.hooks,
            run_id,
            model,
            st,
            job,
            workers,
            lab.cluster.threads_for(workers, res),
            route=self,
            elastic=r.elastic,
            replan=replanner(lab, job, st, model, lambda: profile(b), kind),
            # a slowed run is not predicted (nor refitted on: its slowness was asked for)
            forecast=None if r.slowdown or r.jitter else self.forecast(cost_model, profile(b), res, st, kind),
            data_info=prep.data_info,
            loss_info=prep.loss_info,
        )
        run.optimizer_info = r.optimizer_info
        return run, cost_model

    def rank_call(
        self, run: Run, job: RankJob, restart: int, threads: list[int]
    ) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        import cloudpickle

        from distlab.runtime.trainer import run_rank

        return train_rank, (cloudpickle.dumps(job), run.topic, restart, run_rank)

    def forecast(
        self, cost_model: CostModel | None, profile: Any, res: Any, st: Any, optimizer: str | None = None
    ) -> Forecast | None:
        return forecast_run(cost_model, profile, res, st, optimizer)

    def trained_model(self, launched: Any, weights: Any) -> Any:
        import copy

        from distlab.keras_model import unwrap

        m = copy.deepcopy(launched)
        m.load_state_dict(weights)
        return unwrap(m)  # a Keras model launched comes back as a Keras model

    def no_prediction(self, run: Run) -> str:
        if run.slowdown or run.jitter:
            what = "slowdown=" if run.slowdown else "jitter="
            return f"none: a run with {what} is not predicted, and lab.cost_model is not refitted on it"
        how = run.calibrate_call
        return f"none: the Lab had no cost model at launch; {how} measures this cluster (seconds, cached)"

    def calibrate(
        self, lab: LabSide, *, sizes: Any, cache: bool, progress: bool, models: Any, batch_size: int
    ) -> CostModel:
        from distlab.data import as_dataset

        models = [
            (m[0], as_dataset(m[1], f"models[{i}] data"), *m[2:])
            if isinstance(m, tuple) and len(m) > 1
            else m
            for i, m in enumerate(models)
        ]
        return calibrate_cluster(
            lab.cluster,
            lab.cache_dir,
            sizes=sizes,
            cache=cache,
            progress=progress,
            models=models,
            batch_size=batch_size,
        )


def adaptive_run_options(
    cost_model: CostModel | None, profile: Any, res: ResourceSpec, st: Any, batch: int, optimizer: str | None
) -> dict[str, Any]:
    """An AdaptiveBatch launch's run options: the controller's table, predicted by the Lab's cost
    model (the default model, refitted by the run's own step times, before a calibration)."""
    from distlab.costmodel import CostModel
    from distlab.runs.adaptive import adaptive_options

    sub = res.first(st.world)
    return adaptive_options(cost_model or CostModel.default(), profile, sub, st, batch, optimizer)
