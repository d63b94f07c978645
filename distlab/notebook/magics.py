"""The ``%distlab`` line magic: thin argument parsers over the public API, one per subcommand.

A user's mistake is one line on stderr with what to do (and the near miss, "did you mean ...?");
an unexpected failure is one line with the path of a log holding its traceback. No magic
loses what the session already holds.

Long because each %distlab command is one short method of DistlabMagics (as ipyparallel's magics are),
whose docstring is the command's help."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import textwrap
import traceback
from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from distlab.conventions import is_keras_loss_name
from distlab.errors import DistlabError, DistlabWarning, check_positive, did_you_mean, match_name
from distlab.notebook.run_magic import RunMagic
from distlab.notebook.session import DEFAULT_BATCH, NotebookSession
from distlab.notebook.slurm_start import start_slurm_lab

WIDTH = 88  # %distlab help fits this many columns
_CLUSTER_KINDS = ("status", "local", "slurm", "stop")
# notebook names that are IPython's, not the user's: never suggested
_IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython", "open"}


class UsageError(DistlabError):
    """A magic was called with arguments it does not accept."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and calling sys.exit, matches long options
    ignoring case (and ``_`` for ``-``), and suggests the nearest option for an unknown one."""

    def _long_options(self) -> list[str]:
        return [s for a in self._actions for s in a.option_strings if s.startswith("--")]

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        fixed = []
        for tok in args or []:
            if tok.startswith("--"):
                name, eq, value = tok.partition("=")
                tok = (match_name(name, self._long_options()) or name) + eq + value
            fixed.append(tok)
        return super().parse_args(fixed, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        sub = self.prog.split()[-1]
        if message.startswith("unrecognized arguments:"):
            words = message.split(":", 1)[1].split()
            opts = [w for w in words if w.startswith("-")] or words
            hint = did_you_mean(opts[0].split("=")[0], self._long_options())
            raise UsageError(f"{self.prog}: unknown option {opts[0]!r}{hint} (%distlab help {sub})")
        raise UsageError(f"{self.prog}: {message} (%distlab help {sub})")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            raise UsageError(message.strip())
        raise UsageError(f"{self.prog}: nothing to do")


def make_parser(name: str) -> _Parser:
    return _Parser(prog=f"%distlab {name}", add_help=False, allow_abbrev=False)


def _model_options(p: _Parser) -> None:
    p.add_argument("--data", default=None)
    p.add_argument("--sample-input", default=None)
    p.add_argument("--loss", default=None)
    p.add_argument("--batch-size", type=int, default=None)


def check_option(name: str, value: int | None) -> None:
    check_positive(name, value, UsageError, optional=True)


@magics_class
class DistlabMagics(RunMagic, Magics):
    """``%distlab SUBCOMMAND ...`` and ``%%distlab run`` (run_magic.py). User errors print one line
    and what to do; never a traceback."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.session = NotebookSession()
        self._cell: str | None = None  # the cell of a %%distlab line (run's loop)
        self._recalled: tuple[str, str] | None = None  # (model var, data var) this line reused
        self._commands: dict[str, Callable[[list[str]], Any]] = {
            "profile": self.cmd_profile,
            "cluster": self.cmd_cluster,
            "calibrate": self.cmd_calibrate,
            "simulate": self.cmd_simulate,
            "pick": self.cmd_pick,
            "launch": self.cmd_launch,
            "run": self.cmd_run,
            "compare": self.cmd_compare,
            "help": self.cmd_help,
        }

    @line_cell_magic
    def distlab(self, line: str, cell: str | None = None) -> Any:
        """distlab: profile, simulate, pick and launch distributed training; ``%%distlab run`` trains
        the cell's own loop. ``%distlab help``."""
        try:
            words = shlex.split(line, comments=True)  # a trailing "# ..." is the user's comment
        except ValueError as exc:
            return self._fail(f"cannot parse the line ({exc}); check the quotes")
        if not words:
            return self.cmd_help([])
        name, args = words[0], words[1:]
        known = match_name(name, self._commands)
        if known is None:
            return self._fail(
                f"unknown subcommand {name!r}{did_you_mean(name, self._commands)}; one of: "
                f"{', '.join(self._commands)} (%distlab help)"
            )
        if cell is not None and known != "run":
            return self._fail(
                f"%%distlab {known}: only run takes a cell (%%distlab run); write %distlab {known} ... "
                "on a line of its own"
            )
        self._cell = cell
        remembered = self.session.remembered()  # a line that fails leaves them as they were
        self._recalled = None
        before = self.session.current_lab
        try:
            out = self._commands[known](args)
            self._bind_started_lab(before, known)
            return out
        except DistlabError as exc:
            self.session.restore(remembered)
            return self._fail(str(exc) + self._recalled_hint(str(exc)))
        except KeyboardInterrupt:
            self.session.restore(remembered)
            return self._fail(f"%distlab {known} interrupted; the session is as it was")
        except Exception as exc:  # noqa: BLE001 - never a traceback in the notebook: one line and the log
            self.session.restore(remembered)
            log = _log_traceback(f"%distlab {line}")
            first = (str(exc).splitlines() or [""])[0][:200]
            return self._fail(
                f"%distlab {known} failed unexpectedly ({type(exc).__name__}: {first}); "
                f"the full traceback is in {log}"
            )

    def _bind_started_lab(self, before: Any, command: str) -> None:
        """A subcommand that started the notebook's cluster on first need binds its Lab to ``lab``,
        as ``%distlab cluster local`` does (unless ``lab`` already names something else)."""
        lab = self.session.current_lab
        if command == "cluster" or lab is None or lab is before:
            return
        ns = self.shell.user_ns
        if "lab" in ns and not getattr(ns["lab"], "closed", False):
            return
        ns["lab"] = lab
        print("distlab: started the notebook's cluster; its Lab is in `lab` (lab.launch(...), lab.runs)")

    def _recalled_hint(self, message: str) -> str:
        """For an error about data this line did not give: where the remembered data came from."""
        if self._recalled is None or not message.startswith("data"):
            return ""
        var, data_var = self._recalled
        return (
            f" (the data is `{data_var}`, remembered for {var} from an earlier line; give --data VAR to "
            "use other data)"
        )

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _fail(message: str) -> None:
        print(f"distlab: {message}", file=sys.stderr)
        return None

    def _lookup(self, var: str, what: str, option: str = "") -> tuple[str, Any]:
        """(name, value) of a notebook variable; its case may differ where that is unambiguous."""
        ns = self.shell.user_ns
        names = [k for k in ns if not k.startswith("_") and k not in _IPYTHON_NAMES]
        name = var if var in ns else match_name(var, names)
        if name is not None:
            return name, ns[name]
        where = f"{option} {var!r}" if option else repr(var)
        hint = did_you_mean(var, names)
        raise UsageError(
            f"{where} is not defined in this notebook"
            + (hint if hint else f"; define the {what} first, e.g. {var} = ...")
        )

    def _model(self, a: argparse.Namespace) -> tuple[str, Any]:
        """The model VAR of ``a`` with what its options give, remembered by the session."""
        check_option("--batch-size", a.batch_size)
        var, model = self._lookup(a.var, "model")
        given: dict[str, Any] = {"batch_size": a.batch_size}
        if a.data is not None:
            given["data_var"], given["data"] = self._lookup(a.data, "data", "--data")
        if a.sample_input is not None:
            given["sample_var"], given["sample_input"] = self._lookup(
                a.sample_input, "sample batch", "--sample-input"
            )
        if a.loss is not None and a.loss not in self.shell.user_ns and is_keras_loss_name(a.loss):
            given["loss_var"], given["loss"] = a.loss, a.loss  # a Keras loss name, for a Keras model
        elif a.loss is not None:
            given["loss_var"], given["loss"] = self._lookup(a.loss, "loss", "--loss")
            if not callable(given["loss"]):
                raise UsageError(
                    f"--loss {a.loss!r}: a {type(given['loss']).__name__} is not callable; "
                    "give a function (output, target) -> scalar tensor, e.g. "
                    "torch.nn.functional.cross_entropy"
                )
        inputs = self.session.remember(var, **given)
        if a.data is None and inputs.data is not None:
            self._recalled = (var, inputs.data_var or "?")
        return var, model

    def _optimizer(self, a: argparse.Namespace) -> Any:
        """--optimizer: a notebook variable, else a name (checked here, before any cluster starts)."""
        if a.lr is not None and not a.lr > 0:
            raise UsageError(f"--lr {a.lr:g}: a learning rate must be > 0")
        if a.optimizer is None or a.optimizer in self.shell.user_ns:
            return self.shell.user_ns[a.optimizer] if a.optimizer else None
        from distlab.conventions import OPTIMIZERS

        name = match_name(a.optimizer, list(OPTIMIZERS))
        if name is None:
            raise UsageError(
                f"--optimizer {a.optimizer!r}: no optimizer or notebook variable of that name"
                f"{did_you_mean(a.optimizer, list(OPTIMIZERS))} (names: {', '.join(OPTIMIZERS)})"
            )
        return name

    def _store(self, name: str | None, value: Any) -> None:
        if name:
            self.shell.user_ns[name] = value

    # -- subcommands -------------------------------------------------------------------------
    def cmd_profile(self, argv: list[str]) -> Any:
        """Profile a model: variables, dense vs sparse, FLOPs and time per layer, on a batch
        of its data (--data), a sample batch (--sample-input) or its input_spec.

        %distlab profile VAR [--data VAR] [--sample-input VAR] [--batch-size N] [-o NAME]
        """
        p = make_parser("profile")
        p.add_argument("var")
        _model_options(p)
        p.add_argument("-o", "--output", default=None)
        a = p.parse_args(argv)
        var, model = self._model(a)
        prof = self.session.profile(var, model)
        self._store(a.output, prof)
        from distlab.notebook.views import profile_chart

        display(prof)
        display(profile_chart(prof))
        return None

    def cmd_cluster(self, argv: list[str]) -> Any:
        """Show, choose or stop the notebook's cluster; runs and profiles are kept across
        changes, and a failed start keeps the cluster that works.

        %distlab cluster [status | local [N] [--oversubscribe] | ADDRESS | stop] [-o NAME]
        %distlab cluster slurm N [--partition P] [--gpus G] [--walltime T] [--cores C]
            [--memory M]

        A cluster started here is the notebook's Lab, also bound to ``lab`` (or NAME). slurm N:
        N Dask workers as Slurm jobs (each --cores C, --memory M, --gpus G as --gres=gpu:G);
        stop cancels them.
        """
        p = make_parser("cluster")
        p.add_argument("what", nargs="?", default="status")
        p.add_argument("n", nargs="?", type=int, default=None)
        p.add_argument("--oversubscribe", action="store_true")
        for option in ("--partition", "--walltime", "--memory"):
            p.add_argument(option, default=None)
        p.add_argument("--gpus", type=int, default=None)
        p.add_argument("--cores", type=int, default=None)
        p.add_argument("-o", "--output", default="lab")
        a = p.parse_args(argv)
        what = match_name(a.what, _CLUSTER_KINDS) or a.what
        slurm_options = {k: getattr(a, k) for k in ("partition", "walltime", "memory", "gpus", "cores")}
        if what != "slurm" and (given := [k for k, v in slurm_options.items() if v is not None]):
            raise UsageError(
                f"cluster {what}: --{given[0]} is a Slurm job option; use it with cluster slurm N"
            )
        if what == "stop":
            print(self.session.stop_lab())
            return None
        if what == "status":
            lab = self.session.current_lab
            if lab is None:
                print(
                    "no cluster yet: the first %distlab calibrate, simulate, pick, launch or %%distlab run "
                    "starts one (or %distlab cluster local N)"
                )
            else:
                self.session.heal()
                display(lab)
            return None
        if what == "local":
            from distlab.resources import available_cores

            cores = available_cores()
            if a.n is not None and a.n <= 0:
                raise UsageError(f"local N: N must be a positive number of workers, got {a.n}")
            if a.n is not None and a.n > cores and not a.oversubscribe:
                raise UsageError(
                    f"local {a.n}: this machine has {cores} cores; start at most {cores} workers, "
                    f"or add --oversubscribe to start {a.n} anyway"
                )
            lab = self.session.start_lab(workers=a.n)
        elif what == "slurm":
            if a.n is None or a.n <= 0:
                raise UsageError(f"slurm N: N must be a positive number of worker jobs, got {a.n}")
            lab = start_slurm_lab(self.session, a.n, slurm_options)
        elif "://" in a.what or ":" in a.what:
            lab = self.session.start_lab(address=a.what)
        else:
            raise UsageError(
                f"cluster: expected status, 'local N', 'slurm N', a scheduler ADDRESS (tcp://host:8786) or "
                f"stop, got {a.what!r}{did_you_mean(a.what, _CLUSTER_KINDS)}"
            )
        self._store(a.output, lab)
        print(
            f"the cluster's Lab is in `{a.output}`: {a.output}.launch(...), {a.output}.runs and the "
            "magics use the same one"
        )
        display(lab)
        return None

    def cmd_calibrate(self, argv: list[str]) -> Any:
        """Calibrate the cost model on the cluster: collectives, the training loop, and each
        model VAR's own step at every world size (cached per cluster).

        %distlab calibrate [VAR ...] [--data VAR] [--loss VAR] [--batch-size N] [--force]
        """
        p = make_parser("calibrate")
        p.add_argument("models", nargs="*")
        p.add_argument("--data", default=None)
        p.add_argument("--loss", default=None)
        p.add_argument("--batch-size", type=int, default=None)
        p.add_argument("--force", action="store_true")
        a = p.parse_args(argv)
        if (a.data or a.loss) and len(a.models) != 1:
            raise UsageError(
                "calibrate: --data and --loss go with one model VAR; give each model its own "
                "with %distlab profile VAR --data D"
            )
        models = []
        for v in a.models:
            ns = argparse.Namespace(
                var=v, data=a.data, sample_input=None, loss=a.loss, batch_size=a.batch_size
            )
            models.append(self._model(ns))
        if not models:
            check_option("--batch-size", a.batch_size)
        cm = self.session.calibrate(force=a.force, models=models)
        display(cm)
        return None

    def cmd_simulate(self, argv: list[str]) -> Any:
        """Predict and rank every candidate strategy for a model, beside one process alone.

        %distlab simulate VAR [--workers N] [--top K] [model options] [-o NAME]

        Stale and asynchronous plans rank by throughput; their note says "convergence not
        counted: lab.probe_staleness" (cm.rank(..., staleness_cost=g) ranks by goodput).
        """
        p = make_parser("simulate")
        p.add_argument("var")
        _model_options(p)
        p.add_argument("--workers", type=int, default=None)
        p.add_argument("--top", type=int, default=10)
        p.add_argument("-o", "--output", default=None)
        a = p.parse_args(argv)
        check_option("--workers", a.workers)
        check_option("--top", a.top)
        var, model = self._model(a)
        table = self.session.simulate(var, model, workers=a.workers)
        self._store(a.output, table)
        from distlab.notebook.views import ranking_view

        for view in ranking_view(table, a.top):
            display(view)
        return None

    def cmd_pick(self, argv: list[str]) -> Any:
        """Open the strategy picker for a model; its .value is the chosen Strategy.

        %distlab pick VAR [model options] [-o NAME]

        As in simulate, stale and asynchronous plans say "convergence not counted".
        """
        p = make_parser("pick")
        p.add_argument("var")
        _model_options(p)
        p.add_argument("-o", "--output", default=None)
        a = p.parse_args(argv)
        var, model = self._model(a)
        picker = self.session.picker(var, model)
        self._store(a.output, picker)
        display(picker)
        return None

    def cmd_launch(self, argv: list[str]) -> Any:
        """Train a model on the cluster with a strategy, on its data (--data; else synthetic
        data from its input_spec); the run goes in a variable (-o NAME, default run).

        %distlab launch VAR --strategy NAME|FILE|VAR [--steps N] [--adaptive] [model options]
            [--optimizer NAME|VAR] [--lr X] [--backend torch|tensorflow] [--noblock] [-o NAME]

        --adaptive: an adaptive batch (AdaptDL): the noise scale measured live, the batch
        re-chosen for goodput at epoch boundaries, AdaScale learning-rate scaling.
        --optimizer: adam (the default, at 1e-3; a compiled Keras model's own when it has one),
        sgd, adamw, rmsprop, adagrad, or a notebook variable (a Keras optimizer, or a factory
        params -> torch.optim.Optimizer); --lr sets a named one's rate. --backend tensorflow
        trains a Keras model in TensorFlow's own runtime.
        """
        p = make_parser("launch")
        p.add_argument("var")
        p.add_argument("--strategy", "-s", required=True)
        p.add_argument("--steps", type=int, default=100)
        p.add_argument("--adaptive", action="store_true")
        p.add_argument("--optimizer", default=None)
        p.add_argument("--lr", type=float, default=None)
        p.add_argument("--backend", choices=("torch", "tensorflow"), default="torch")
        _model_options(p)
        p.add_argument("--noblock", action="store_true")
        p.add_argument("-o", "--output", default="run")
        a = p.parse_args(argv)
        check_option("--steps", a.steps)
        if not a.output.isidentifier():
            raise UsageError(f"-o {a.output!r}: not a Python name; e.g. -o run2")
        var, model = self._model(a)
        strategy = self._strategy(a.strategy)
        if self.session.inputs_of(var).data is None:
            print(
                f"no --data for {var}: it trains on synthetic data from its input_spec "
                f"(%distlab launch {var} --data DS ... trains on yours)"
            )
        optimizer = self._optimizer(a)
        if a.adaptive:
            strategy = self.session.adaptive(var, model, strategy)
        run = self.session.launch(
            var, model, strategy, steps=a.steps, optimizer=optimizer, lr=a.lr, backend=a.backend
        )
        run.var_name = a.output
        self._store(a.output, run)
        print(
            f"run {run.id} is in `{a.output}`: {a.output}.model is the trained model once it finishes, "
            f"{a.output}.metrics its steps"
        )
        return self._follow(run, a.noblock)

    def cmd_compare(self, argv: list[str]) -> Any:
        """Plot predicted against measured throughput for every run of this notebook.

        %distlab compare
        """
        make_parser("compare").parse_args(argv)
        runs = self.session.runs_frame()
        from distlab.notebook import plots
        from distlab.notebook.views import runs_table

        display(runs_table(runs))
        notes = sorted({n for v in runs.get("prediction_notes", ()) if v for n in str(v).split("; ")})
        for note in notes:  # what the predictions rest on: said once, not per run
            print(f"predictions: {note}")
        if runs["predicted_throughput"].notna().any():
            display(plots.predicted_vs_measured(runs))
        else:
            print(
                "no predictions to plot: these runs started before the model's cost was known; "
                "run %distlab calibrate (or %distlab simulate VAR), then launch again"
            )
        return None

    def cmd_help(self, argv: list[str]) -> Any:
        """Show the subcommands, or the usage of one.

        %distlab help [SUBCOMMAND]
        """
        if argv:
            name = match_name(argv[0], self._commands)
            if name is None:
                raise UsageError(
                    f"help: unknown subcommand {argv[0]!r}{did_you_mean(argv[0], self._commands)}; "
                    f"one of: {', '.join(self._commands)}"
                )
            print(_dedent(self._commands[name].__doc__))
            if name in ("profile", "calibrate", "simulate", "pick", "launch"):
                print("\n" + _MODEL_HELP)
            return None
        lines = ["%distlab SUBCOMMAND ...   plan, simulate and launch distributed training", ""]
        for cmd in self._commands.values():
            doc = _dedent(cmd.__doc__)
            usage = " ".join(
                ln.strip() for ln in doc.splitlines() if ln.strip().startswith(("%distlab", "%%distlab", "["))
            )
            summary = doc.split("\n\n")[0].replace("\n", " ")
            lines += textwrap.wrap(usage, WIDTH, initial_indent="  ", subsequent_indent="      ")
            lines += textwrap.wrap(summary, WIDTH, initial_indent="      ", subsequent_indent="      ")
        lines += ["", _MODEL_HELP]
        print("\n".join(lines))
        return None


_MODEL_HELP = "\n".join(
    textwrap.wrap(
        "model options, remembered per model VAR by the later magics: --data VAR (a Dataset, a "
        "DataLoader, or an (inputs, targets) pair of tensors or arrays), --sample-input VAR (a batch "
        "the model accepts), --loss VAR|NAME (a function (output, target), or a Keras loss name such as "
        "sparse_categorical_crossentropy for a Keras model; default: a compiled Keras model's loss, "
        "else cross-entropy for integer targets, mean-squared error for float ones), --batch-size N "
        f"(per replica, default "
        f"{DEFAULT_BATCH}).",
        WIDTH,
    )
)


def _dedent(doc: str | None) -> str:
    if not doc:
        return ""
    head, _, rest = doc.partition("\n")
    return (head.strip() + "\n" + textwrap.dedent(rest)).strip()


def _log_traceback(what: str) -> str:
    """Append the current exception's traceback to this process's magic log; return its path."""
    path = os.path.join(tempfile.gettempdir(), f"distlab-magics-{os.getpid()}.log")
    with open(path, "a") as f:
        f.write(f"--- {what}\n{traceback.format_exc()}\n")
    return path


def load_ipython_extension(ipython: Any) -> None:
    """Register ``%distlab`` in ``ipython`` once: ``import distlab``, ``%load_ext distlab`` and the
    distlab kernel all come here, and a second call keeps the first one's session (its Lab, data
    and runs)."""
    if getattr(ipython, "_distlab_magics", None) is not None:
        ipython.extension_manager.loaded.add("distlab")  # %load_ext after the import: already in
        return
    magics = DistlabMagics(ipython)
    ipython.register_magics(magics)
    _show_distlab_warnings()
    ipython._distlab_magics = magics  # unload stops what this instance started


def _show_distlab_warnings() -> None:
    """distlab's warnings in the notebook: one ``distlab:`` line, as its errors are, without the
    file path and source line Python's format adds; every other warning as it was."""
    import warnings

    original = warnings.showwarning
    if getattr(original, "distlab", False):
        return

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if isinstance(category, type) and issubclass(category, DistlabWarning):
            print(f"distlab: {message}", file=sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    show.distlab = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def unload_ipython_extension(ipython: Any) -> None:
    magics = getattr(ipython, "_distlab_magics", None)
    if magics is not None and magics.session.current_lab is not None:
        magics.session.stop_lab()
    ipython.magics_manager.magics["line"].pop("distlab", None)
    ipython.magics_manager.magics["cell"].pop("distlab", None)
    ipython._distlab_magics = None
