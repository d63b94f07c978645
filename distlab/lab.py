"""Lab: owns the notebook's Dask cluster, its calibration and its runs; launches strategies on it.

Long because Lab is the notebook's one object (cluster, launches, calibration, runs); each method is short
and hands its work to the modules beside it (prepare, calibrate, measure, run, report)."""

from __future__ import annotations

import html
import shutil
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from distlab.cluster.cluster import Cluster
from distlab.cluster.slurm import slurm_spec
from distlab.conventions import resolve as resolve_conventions
from distlab.errors import CalibrationError, DistlabError, LaunchError
from distlab.files import cache_home
from distlab.native_tf.route import NativeRoute
from distlab.resources import ResourceSpec
from distlab.runs import ckpt_dirs, prepare
from distlab.runs import validate as _v
from distlab.runs.forecast import refit_after_run
from distlab.runs.report import lab_card, runs_frame
from distlab.runs.route import LabSide, LaunchRequest, Route, next_run_id
from distlab.runs.run import CANCEL_WITHIN, Run, RunHooks
from distlab.sched.lab_cluster import ClusterView
from distlab.sched.lab_pricing import ProfileTap, chosen_strategy
from distlab.sched.lab_scheduler import DEFAULT_INTERVAL, LabScheduler, asked_workers, lab_policy
from distlab.sched.queue import LabQueue
from distlab.torch_route import TorchRoute

CLOSED = "this Lab is closed; start a new one: lab = dl.Lab() (or %distlab cluster local N)"


ROUTES: dict[str, Route] = {r.name: r for r in (TorchRoute(), NativeRoute())}  # by ``backend=``


def _route(backend: str, error: type[DistlabError]) -> Route:
    """The route ``backend`` names: the one place a launch or calibration asks which runtime."""
    if backend not in ROUTES:
        if error is CalibrationError:
            raise CalibrationError(f"calibrate: backend must be 'torch' or 'tensorflow', got {backend!r}")
        raise error(f"backend: {backend!r} is not one of 'torch', 'tensorflow'")
    return ROUTES[backend]


class Lab:
    """A Dask cluster for this notebook: the embedded LocalCluster, or one you attach to.

    ``Lab()`` starts one non-daemonic worker process per core on loopback (no dashboard unless
    ``dashboard=True``); ``Lab(address=...)`` / ``Lab(client=...)`` attach to a running scheduler
    (``security`` is passed through for TLS), waiting up to ``timeout`` seconds for ``workers``
    workers (at least one) to join it; ``Lab(gpus=True)`` starts dask-cuda's
    ``LocalCUDACluster`` (one worker per GPU), and ``Lab(n, gpus=True)`` with more workers than
    GPUs lets them share the GPUs in turn (ranks on one device exchange over gloo).

    ``scheduler=None``: one run at a time. ``"fifo"``, ``"goodput"`` or a ``distlab.sched.Policy``:
    runs share the Lab, each on workers of its own (ranks use their worker's default process group),
    queued while they do not fit, re-allocated every ``interval`` s (default 30) through a pause at a
    step with a checkpoint (``lab.queue``; docs/shared-cluster.md).
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        address: str | None = None,
        client: Any = None,
        gpus: bool = False,
        security: Any = None,
        threads_per_worker: int | None = None,
        dashboard: bool | str = False,
        timeout: float = 60,
        cache_dir: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        cluster: str | None = None,
        cores: int = 1,
        memory: str = "4GB",
        gpus_per_worker: int = 0,
        partition: str | None = None,
        account: str | None = None,
        walltime: str | None = None,
        job_extra: Sequence[str] = (),
        scheduler: Any = None,
        interval: float | None = None,
    ) -> None:
        policy = lab_policy(scheduler, interval)  # a bad one is refused before a cluster starts
        if workers is not None:
            _v.check_positive("workers", workers)
        if sum(x is not None for x in (address, client)) > 1:
            raise LaunchError("Lab: give either address= or client=, not both")
        slurm = slurm_spec(
            cluster,
            attached=address is not None or client is not None,
            gpus=gpus,
            cores=cores,
            memory=memory,
            gpus_per_worker=gpus_per_worker,
            partition=partition,
            account=account,
            walltime=walltime,
            job_extra=job_extra,
        )
        self._closed = False
        self.via_magics = False  # cards name the %distlab magic instead of the Python call
        self.cost_model: Any = None
        self.cache_dir = Path(cache_dir) if cache_dir else cache_home()
        self._own_ckpt = checkpoint_dir is None
        # one checkpoint per running run, none once it ended (runs/ckpt_dirs.py); a folder of its own
        # says who owns it, so the next Lab removes it if this process is killed
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else ckpt_dirs.make_own()
        # a Lab of its own checkpoint folder removes it when closed, collected, or the process exits
        self._remove_ckpt = (
            weakref.finalize(self, shutil.rmtree, str(self.checkpoint_dir), True) if self._own_ckpt else None
        )
        self._runs: list[Run] = []
        self._profiles = ProfileTap()  # a ProfileCache; a shared Lab's scheduler prices runs with them
        self.cluster = Cluster(
            workers,
            address=address,
            client=client,
            gpus=gpus,
            security=security,
            threads_per_worker=threads_per_worker,
            dashboard=dashboard,
            timeout=timeout,
            on_fail=self._remove_ckpt,
            slurm=slurm,
            slurm_logs=self.cache_dir / "slurm",
        )
        self._scheduler: LabScheduler | None = None
        if policy is not None:
            every, cm = DEFAULT_INTERVAL if interval is None else interval, lambda: self.cost_model
            self._scheduler = LabScheduler(
                self.cluster, policy, every, cost_model=cm, checkpoint_dir=self.checkpoint_dir
            )
        if self.cluster.jobs is not None:  # a worker whose Slurm job ends is replaced, its runs grown back
            shrinkable = lambda: list(self._runs) if self._scheduler is None else []  # noqa: E731
            self.cluster.jobs.keep_workers(shrinkable, lambda: self.workers, within=self.cluster.timeout)

    # -- cluster ----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once ``close()`` ran: the Lab then launches, calibrates and measures nothing."""
        return self._closed

    def calibrate_call(self) -> str:
        """What calibrates this Lab, as its user types it: the magic in a magics notebook."""
        return "%distlab calibrate" if self.via_magics else "lab.calibrate()"

    def _check_open(self) -> None:
        if self._closed:
            raise LaunchError(CLOSED)

    @property
    def client(self) -> Any:
        """The Dask client of the Lab's cluster (``lab.cluster``)."""
        return self.cluster.client

    @property
    def timeout(self) -> float:
        """Seconds any rendezvous, collective or wait for workers may take (``Lab(timeout=)``)."""
        return self.cluster.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self.cluster.timeout = seconds

    @property
    def resources(self) -> ResourceSpec:
        """The live cluster: one rank per worker, ranks ordered by (host, worker address)."""
        self._check_open()
        return self.cluster.resources

    @property
    def workers(self) -> list[str]:
        return list(self.resources.addresses)

    def close(self) -> None:
        """Stop every run, the embedded cluster (or this Lab's client) and remove its checkpoints."""
        if self._closed:
            return
        self._closed = True
        if self._scheduler is not None:  # no round moves a run while they are cancelled
            self._scheduler.close()
        unsettled = [run for run in self._runs if not run.done]
        for run in unsettled:
            try:
                run.cancel()
            except Exception:  # noqa: BLE001 - ranks that ignore the stop end with their workers below
                pass
        self.cluster.close()
        for run in unsettled:  # their drivers see the client gone and settle them as cancelled
            run.join(CANCEL_WITHIN)
        if self._remove_ckpt is not None:
            self._remove_ckpt()

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the generic SPMD core ------------------------------------------------------------------------
    def run_ranks(
        self,
        fn: Callable[..., Any],
        *args: Any,
        world: int | None = None,
        timeout: float | None = None,
        on_tick: Callable[[str], None] | None = None,
    ) -> list[Any]:
        """``fn(rank, world, master_addr, master_port, *args)`` once per rank; results in rank order.

        One pinned Dask task per worker; the first failure stops every rank and raises a
        ``LaunchError`` summarising it. ``on_tick(what)`` is called (on the client's event thread)
        for each ``distlab.runtime.progress.tick(what)`` rank 0 makes.
        """
        self._check_idle()
        return self.cluster.run_ranks(fn, *args, world=world, timeout=timeout, on_tick=on_tick)

    def scale(self, n: int, timeout: float | None = None) -> ResourceSpec:
        """Resize the embedded cluster to ``n`` workers; returns ``lab.resources``.

        A run in flight is paused first: its ranks stop at a step and write a checkpoint there.
        Once the cluster has ``n`` workers, it resumes on all of them from that step, at the same
        data position (every sample of an epoch seen once across resizes), its strategy re-planned
        for the new world; an adaptive run re-chooses its batch for it. If the cluster does not
        reach ``n`` workers within ``timeout`` (default: the Lab's), the run resumes on the workers
        there are and one ``LaunchError`` says so; its checkpoint stays in place.
        """
        self._check_open()
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise LaunchError(f"lab.scale({n!r}): a Lab needs at least 1 worker (lab.close() stops it)")
        self.cluster.check_scalable()  # before any run pauses
        limit = float(timeout or self.timeout)
        # a shared Lab's runs all pause, and its scheduler places them on the workers there are then
        shared, grow = self._scheduler, lambda: self.cluster.scale(n, limit)
        paused = [] if shared else [r for r in self._runs if not r.done and r.pause(limit)]
        have = shared.rescale(grow, limit) if shared else grow()
        workers = list(self.resources.addresses)
        for run in paused:
            run.resume_on(workers)
        if have != n:
            raise LaunchError(
                f"lab.scale({n}): the cluster has {have} workers after {limit:g} s"
                + (f"; run {paused[0].id} resumed on them from its checkpoint" if paused else "")
                + ("; its runs are placed on them" if shared else "")
                + "; try again, or a longer timeout="
            )
        return self.resources

    def adapt(self, minimum: int, maximum: int) -> None:
        """A shared Lab's cluster follows its runs, ``minimum..maximum`` workers (sched/lab_adapt.py)."""
        from distlab.sched.lab_adapt import check_adapt

        self.cluster.check_scalable()
        check_adapt(self._scheduler, minimum, maximum).wake()

    def _check_idle(self) -> None:
        """Open, no run in flight, and the embedded cluster whole again (a worker lost to a crash comes
        back)."""
        self._check_open()
        for run in self._runs:
            if not run.done:
                raise LaunchError(
                    f"run {run.id} is still {run.status}; run.wait() or run.cancel() it before launching "
                    "another"
                )
        self.heal()

    @property
    def lost_workers(self) -> int:
        """How many of the embedded cluster's workers are not running now (killed, crashed; 0 for
        an attached cluster): ``heal()``, or the next launch, restarts them."""
        return self.cluster.lost_workers if not self._closed else 0

    def heal(self) -> int:
        """Restart the embedded cluster's lost workers and wait for them; returns how many were lost."""
        self._check_open()
        lost = self.lost_workers
        self.cluster.heal()
        return lost

    # -- launching ------------------------------------------------------------------------------------
    def launch(
        self,
        model: Any,
        strategy: Any = "AllReduce",
        steps: int = 100,
        data: Any = None,
        loss: Any = None,
        optimizer: Any = None,
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        checkpoint_every: int | None = None,
        elastic: bool = True,
        timeout: float | None = None,
        block: bool = False,
        backend: str = "torch",
        trace: bool = False,
        lr: float | None = None,
        slowdown: dict[int, float] | None = None,
        jitter: float | None = None,
        workers: int | None = None,
        min_workers: int | None = None,
        max_workers: int | None = None,
    ) -> Run:
        """Train ``model`` under ``strategy`` on the cluster; returns a live ``Run`` (all checks happen
        first).

        ``data``: a Dataset of ``(input, target)`` pairs, a DataLoader (its dataset), or an
        ``(inputs, targets)`` pair of tensors or arrays; None trains on synthetic data from the
        model's ``input_spec`` (the Run card says so). ``loss``: a callable ``(output, target)``,
        or for a Keras model a Keras loss (object, function or name, called as Keras calls it);
        the default is a compiled Keras model's loss, else cross-entropy for integer targets,
        mean-squared error for float ones. ``optimizer``: a factory ``params -> torch.optim.Optimizer``,
        a name (``"adam"``, ``"sgd"``, ``"adamw"``, ``"rmsprop"``, ``"adagrad"``) or a Keras optimizer;
        the default is a compiled Keras model's, else Adam at 1e-3; ``lr`` sets a named or Keras
        optimizer's rate (distlab.conventions). The Run card names both and where they came from.
        The model is checked and profiled on a batch of ``data`` at the per-replica batch it trains at; a
        builder name is built for that batch. With
        a cost model (``lab.calibrate()``), the model's own step is measured on the workers first
        (``measure_model``, cached) and the prediction recorded in ``lab.runs``; the finished run
        refits ``lab.cost_model``.

        When ``elastic`` and ``checkpoint_every`` is not given, a synchronous run's checkpoints take
        at most 1% of its time: after ``max(10, steps // 10)`` steps its ranks plan the first from an
        estimate of its cost (its bytes), then each next from the last one's measured cost, at least
        every 5 minutes and never closer than those first steps (runtime/cut.py ``TimedCadence``; a
        run too short to afford one checkpoints only when resized; an asynchronous run's cuts alike,
        each rank's clock timing the next by its last cut's cost: ``TimedCutCadence``); a given
        ``checkpoint_every`` is a fixed count. The run keeps its newest checkpoint only, and none once
        it ended (``run.last_checkpoint`` says when it was taken). ``trace=True``: every rank records
        a timeline of its compute and communication (``run.timeline()``, ``run.save_trace(path)``;
        runtime/trace.py). ``slowdown={rank: factor}``: that rank computes ``factor`` (>= 1) times
        slower, a straggler to measure (each step's record gains ``delay``); ``jitter=σ``: every
        rank's compute varies step to step by σ of its forward+backward (an exponential extra wait,
        RunOptions.jitter), the noise a busy or shared machine adds.

        ``workers=N``: the run takes N workers (default: all). On a Lab with a scheduler it asks
        for ``workers`` (or ``min_workers..max_workers``, default 1..all) while other runs train,
        waits "queued" for workers of its own and may be resized among them (re-planned each
        time); it is not predicted while others train (measuring its model would share their workers).
        There ``strategy="auto"`` lets the scheduler choose it per allocation (docs/shared-cluster.md).
        """
        # Long because its signature and docstring are the launch's reference; the body is the
        # checks every route shares, then the route's launch (runs/route.py)
        steps = _v.check_positive("steps", steps)
        batch_size = _v.check_positive("batch_size", batch_size, optional=True)
        route = _route(backend, LaunchError)
        conv = resolve_conventions(model, loss, optimizer, backend, lr)
        checkpoint_every = _v.check_positive("checkpoint_every", checkpoint_every, optional=True)
        stragglers, jitter = _v.check_slowdown(slowdown), _v.check_jitter(jitter)
        if (stragglers or jitter) and not route.traced:
            what = "slowdown=" if stragglers else "jitter="
            raise LaunchError(f"{what}: native TensorFlow runs cannot slow a rank; use backend='torch'")
        if trace and not route.traced:
            raise LaunchError(
                "trace=True: native TensorFlow runs are not traced; trace the torch route (backend='torch')"
            )
        strategy, chooses = chosen_strategy(strategy, self._scheduler is not None)
        share = self._share(strategy, workers, min_workers, max_workers)
        request = LaunchRequest(
            model,
            strategy,
            steps,
            data,
            conv.loss,
            conv.optimizer,
            batch_size,
            shuffle,
            seed,
            checkpoint_every,
            elastic,
            timeout,
            bool(trace),
            conv.optimizer_info,
            conv.metrics,
            stragglers,
            jitter,
        )
        return self._start(lambda side: route.launch(side, request), share, elastic, block, chooses)

    def _share(self, strategy: Any, *counts: int | None) -> tuple[ClusterView, int, int] | None:
        """Open and whole (idle too, one run at a time); the run's view (planned on its first ``most``
        workers, re-planned for the ones it gets) and the (fewest, most) it asks for."""
        have, grows = len(self.resources.addresses), self.cluster.local is not None
        asked = asked_workers(self._scheduler is not None, strategy, *counts, have=have, grows=grows)
        if self._scheduler is None:
            self._check_idle()
        else:
            self.heal()
        return (ClusterView(self.cluster, self.cluster.first(asked[1])), *asked) if asked else None

    def _start(
        self, make: Callable[[LabSide], Any], share: Any, elastic: bool, block: bool, auto=False
    ) -> Run:
        """The run ``make`` s on the Lab (or its share): started, or queued (``auto``: strategy="auto")."""
        busy = any(not r.done for r in self._runs)
        run, cost_model = make(self._side(share[0] if share else None, measure=not busy))
        profiles = self._profiles.taken()
        if not busy:
            self.cost_model = cost_model
        self._runs.append(run)
        if self.cluster.jobs is not None:  # on Slurm: a run predicted to outlast the jobs is warned of
            self.cluster.jobs.check_run(run)
        if self._scheduler is not None and share:
            self._scheduler.submit(run, *share, resizable=elastic, chooses=auto, profiles=profiles)
        else:
            run.start()
        if block:
            run.wait()
        return run

    def run(
        self,
        train: Any,
        strategy: Any = "AllReduce",
        workers: int | None = None,
        timeout: float | None = None,
        *,
        seed: int = 0,
        elastic: bool = True,
        checkpoint_every: int | None = None,
        trace: bool = False,
        block: bool = False,
        min_workers: int | None = None,
        max_workers: int | None = None,
        **options: Any,
    ) -> Run:
        """Run your own training loop ``train(ctx)`` on every rank (or the first ``workers``) under
        ``strategy``; returns the same live ``Run`` as ``launch`` (card, view, ``run.metrics``,
        ``wait``, ``cancel``, ``timeline`` when traced). ``run.model`` is rank 0's trained model,
        ``run.result`` rank 0's return value.

        ``train`` calls ``ctx.prepare(model, optimizer, loader, scheduler=None)`` once, then loops
        as on one process (``distlab.TrainContext``; docs/own-loop.md). It runs once here in the
        kernel up to ``ctx.prepare``: the strategy (a builder name, a ``Strategy`` or a JSON file,
        as ``launch`` takes) is built for the model and the loader's batch it prepares, and the
        card predicts that (basis "profile") when the Lab has a cost model. ``elastic``: the loop
        checkpoints (model, optimizer, scheduler, ``ctx.state`` objects, data position; as
        ``launch`` times them) and resumes at the exact step after a lost worker or ``scale``.
        With a scheduler, ``workers`` (or ``min_workers..max_workers``) is what the run asks for, as
        ``launch`` documents; ``options``: ``slowdown=``, ``jitter=``, ``metrics=`` as it takes them."""
        from distlab.own_route import launch_own, own_options

        # one run at a time: launch_own takes the first ``workers``; a share holds the ones asked for
        counts = (workers, min_workers, max_workers)
        strategy, chooses = chosen_strategy(strategy, self._scheduler is not None)
        share = self._share(strategy, *counts) if self._scheduler else self._check_idle()
        every = _v.check_positive("checkpoint_every", checkpoint_every, optional=True)
        count, extra = None if share else workers, own_options(options)

        def make(side: LabSide) -> tuple[Run, Any]:
            run = launch_own(side, train, strategy, count, timeout, seed, elastic, trace, every, *extra)
            return run, self.cost_model

        return self._start(make, share, elastic, block, chooses)

    def probe_staleness(
        self,
        model: Any,
        data: Any = None,
        staleness: Any = (1, 4, "async"),
        steps: int = 60,
        builder: str = "PSLoadBalancing",
        batch_size: int | None = None,
        **launch_options: Any,
    ) -> dict[Any, float]:
        """g(s): how many more steps ``model`` needs to reach a target loss at each staleness
        (``"async"``: asynchronous PS) than synchronously, from a short run of each on this Lab
        (runs/staleness.py); ``launch_options`` go to every run (``slowdown=``, ``jitter=``,
        ``loss=``, ``optimizer=``). Pass the result as ``g`` to ``consistency.price`` or as
        ``staleness_cost`` to ``CostModel.rank``: goodput = throughput / g(s)."""
        from distlab.runs.staleness import probe_on

        res, options = self.resources, launch_options
        return probe_on(self.launch, res, model, data, staleness, steps, builder, batch_size, options)

    def _side(self, view: ClusterView | None = None, measure: bool = True) -> LabSide:
        """What a route may use of this Lab (runs/route.py): a shared run its own workers (``view``);
        no cost model while others train (``measure``: its model's step would run on their workers)."""
        cost_model = (lambda: self.cost_model) if measure else (lambda: None)
        side = (self._hooks(), cost_model, self.cache_dir, self.checkpoint_dir, self._profiles)
        return LabSide(view if view is not None else self.cluster, *side)  # type: ignore[arg-type]

    def _hooks(self) -> RunHooks:
        """What this Lab's runs get from it (runs/run.py)."""
        return RunHooks(self.client, next_run_id, self._after_run, self.calibrate_call())

    def _after_run(self, run: Run) -> str | None:
        """(driver thread) Refit the cost model on every run so far (runs/forecast.py); the note
        the run's ``wait`` shows when runs keep landing far from their predictions."""
        if self.cost_model is None or not run.forecast:
            return None
        again = "%distlab calibrate --force" if self.via_magics else "lab.calibrate(cache=False)"
        self.cost_model, note = refit_after_run(self.cost_model, self.runs, self._runs, again)
        return note

    @property
    def runs(self) -> Any:
        """One row per run (``distlab.runs.report.runs_frame``: the columns and what they mean)."""
        return runs_frame(self._runs)

    @property
    def queue(self) -> LabQueue:
        """The runs with their workers, state and goodput (``lab.queue.frame()``, a table in a
        notebook) and ``lab.queue.plot()``, their allocations over time (distlab/sched/queue.py)."""
        return LabQueue(self._scheduler, list(self._runs))

    @property
    def scheduler(self) -> LabScheduler | None:
        """A shared Lab's scheduler (``policy``, ``interval``, ``notes``, ``step()``), else None."""
        return self._scheduler

    @property
    def history(self) -> list[Run]:
        """The Run handles of this Lab, oldest first."""
        return list(self._runs)

    # -- calibration ------------------------------------------------------------------------------------
    def calibrate(
        self,
        sizes: Any = None,
        cache: bool = True,
        progress: bool = True,
        models: Any = (),
        batch_size: int = 32,
        backend: str = "torch",
    ) -> Any:
        """Microbenchmark collectives and compute on this cluster and fit a ``CostModel`` (cached).

        ``backend="tensorflow"``: TensorFlow's side instead, for native Keras runs, added to
        ``lab.cost_model`` (costmodel/native.py).

        ``models``: nn.Modules (or ``(module, data)`` / ``(module, data, loss)``, data in any
        form ``lab.launch`` takes) to plan for; each one's own step is
        measured with every rank busy at each world size, at per-replica batches ``batch_size``
        and ``batch_size // 4`` (seconds to a minute per model), and predictions for it use that
        instead of its profile scaled by the contention model (docs/cost-model.md).
        """
        route = _route(backend, CalibrationError)
        self._check_idle()
        self.cluster.settle()  # a fresh worker's warm-up import would share the cores being measured
        self.cost_model = route.calibrate(
            self._side(), sizes=sizes, cache=cache, progress=progress, models=models, batch_size=batch_size
        )
        return self.cost_model

    def measure_model(
        self, model: Any, data: Any = None, loss: Any = None, batch_size: int = 32, progress: bool = True
    ) -> Any:
        """Measure ``model``'s own step on the workers (seconds; cached per model and cluster) and
        return ``lab.cost_model`` (the default model when not calibrated) predicting with it.

        ``lab.launch``, ``%distlab simulate``, ``%distlab pick`` and the picker do this for the
        model they plan, so its compute is what a rank measures, not the profile scaled.
        """
        from distlab.calibration.campaign import measure_model
        from distlab.data import as_dataset

        model = prepare.as_module(model)
        _v.check_model(model)
        _v.check_loss(loss)
        self._check_idle()
        self.cost_model = measure_model(
            self.cluster,
            self.cache_dir,
            self.cost_model,
            model,
            as_dataset(data),
            loss,
            _v.check_positive("batch_size", batch_size),
            progress=progress,
        )
        return self.cost_model

    # -- rendering --------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        if self._closed:
            return f"<Lab (closed), {len(self._runs)} runs: lab = dl.Lab() starts a new one>"
        if lost := self.lost_workers:
            return f"<Lab {self.cluster.lost_text(lost)}, {len(self._runs)} runs>"
        res = self.resources
        return f"<Lab {res.world} workers on {res.num_hosts} host(s), {len(self._runs)} runs>"

    def _repr_html_(self) -> str:
        if self._closed:
            return f"<p><b>Lab</b> (closed): {len(self._runs)} runs. {html.escape(CLOSED)}</p>"
        if lost := self.lost_workers:
            text = self.cluster.lost_text(lost)
            return f"<p><b>Lab</b>: {html.escape(text)}, {len(self._runs)} runs.</p>"
        how = self.calibrate_call()
        calibrated = self.cost_model is not None and self.cost_model.fingerprint.get("calibrated")
        cm = "calibrated" if calibrated else f"not calibrated ({how})"
        return lab_card(self.resources, len(self._runs), cm, self.checkpoint_dir)
