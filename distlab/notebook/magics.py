"""The ``%distlab`` line magic: thin argument parsers over the public API, one per subcommand."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display

from distlab.errors import DistlabError
from distlab.notebook.session import NotebookSession


class UsageError(DistlabError):
    """A magic was called with arguments it does not accept."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and calling sys.exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see %distlab help {self.prog.split()[-1]})")

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            raise UsageError(message.strip())
        raise UsageError(f"{self.prog}: nothing to do")


def _parser(name: str, doc: str | None) -> _Parser:
    return _Parser(prog=f"%distlab {name}", description=(doc or "").strip().splitlines()[0], add_help=False)


@magics_class
class DistlabMagics(Magics):
    """``%distlab SUBCOMMAND ...``. User errors print one line and what to do; never a traceback."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.session = NotebookSession()
        self._commands: dict[str, Callable[[list[str]], Any]] = {
            "profile": self.cmd_profile,
            "cluster": self.cmd_cluster,
            "calibrate": self.cmd_calibrate,
            "simulate": self.cmd_simulate,
            "pick": self.cmd_pick,
            "launch": self.cmd_launch,
            "compare": self.cmd_compare,
            "help": self.cmd_help,
        }

    @line_magic
    def distlab(self, line: str) -> Any:
        """distlab: profile, simulate, pick and launch distributed training. ``%distlab help``."""
        try:
            words = shlex.split(line)
        except ValueError as exc:
            return self._fail(f"cannot parse the line ({exc}); check the quotes")
        if not words:
            return self.cmd_help([])
        name, args = words[0], words[1:]
        cmd = self._commands.get(name)
        if cmd is None:
            return self._fail(f"unknown subcommand {name!r}; one of: {', '.join(self._commands)} (%distlab help)")
        try:
            return cmd(args)
        except DistlabError as exc:
            return self._fail(str(exc))

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _fail(message: str) -> None:
        print(f"distlab: {message}", file=sys.stderr)
        return None

    def _lookup(self, var: str, what: str) -> Any:
        ns = self.shell.user_ns
        if var not in ns:
            raise UsageError(f"{var!r} is not defined in this notebook; define the {what} first, e.g. {var} = ...")
        return ns[var]

    def _store(self, name: str | None, value: Any) -> None:
        if name:
            self.shell.user_ns[name] = value

    # -- subcommands -------------------------------------------------------------------------
    def cmd_profile(self, argv: list[str]) -> Any:
        """Profile a model: variables, dense vs sparse, FLOPs and time per layer.

        %distlab profile VAR [--batch-size N] [-o NAME]
        """
        p = _parser("profile", self.cmd_profile.__doc__)
        p.add_argument("var")
        p.add_argument("--batch-size", type=int, default=32)
        p.add_argument("-o", "--output", default=None)
        a = p.parse_args(argv)
        if a.batch_size <= 0:
            raise UsageError(f"--batch-size: must be positive, got {a.batch_size}")
        model = self._lookup(a.var, "model")
        prof = self.session.profile(a.var, model, batch_size=a.batch_size)
        self._store(a.output, prof)
        from distlab.notebook.views import profile_chart

        display(prof)
        display(profile_chart(prof))
        return None

    def cmd_cluster(self, argv: list[str]) -> Any:
        """Choose, show or stop the notebook's cluster.

        %distlab cluster [local N | ADDRESS | stop | status]
        """
        p = _parser("cluster", self.cmd_cluster.__doc__)
        p.add_argument("what", nargs="?", default="status")
        p.add_argument("n", nargs="?", type=int, default=None)
        a = p.parse_args(argv)
        if a.what == "stop":
            print(self.session.stop_lab())
            return None
        if a.what == "status":
            lab = self.session.current_lab
            if lab is None:
                print("no cluster yet: the first %distlab launch or calibrate starts a local one (%distlab cluster local N)")
            else:
                display(lab)
            return None
        if a.what == "local":
            if a.n is not None and a.n <= 0:
                raise UsageError(f"local N: N must be a positive number of workers, got {a.n}")
            lab = self.session.start_lab(workers=a.n)
        elif "://" in a.what or ":" in a.what:
            lab = self.session.start_lab(address=a.what)
        else:
            raise UsageError(f"cluster: expected 'local N', a scheduler ADDRESS (tcp://host:8786), 'stop' or 'status', got {a.what!r}")
        display(lab)
        return None

    def cmd_calibrate(self, argv: list[str]) -> Any:
        """Calibrate the cost model on the notebook's cluster (microbenchmarks, and each model VAR's
        own step with 1..N ranks busy; cached).

        %distlab calibrate [VAR ...] [--batch-size N] [--force]
        """
        p = _parser("calibrate", self.cmd_calibrate.__doc__)
        p.add_argument("models", nargs="*")
        p.add_argument("--batch-size", type=int, default=32)
        p.add_argument("--force", action="store_true")
        a = p.parse_args(argv)
        if a.batch_size <= 0:
            raise UsageError(f"--batch-size: must be positive, got {a.batch_size}")
        models = [self._lookup(v, "model") for v in a.models]
        cm = self.session.calibrate(force=a.force, models=models, batch_size=a.batch_size)
        display(cm)
        return None

    def cmd_simulate(self, argv: list[str]) -> Any:
        """Predict and rank every candidate strategy for a model on the cluster.

        %distlab simulate VAR [--workers N] [--top K] [-o NAME]
        """
        p = _parser("simulate", self.cmd_simulate.__doc__)
        p.add_argument("var")
        p.add_argument("--workers", type=int, default=None)
        p.add_argument("--top", type=int, default=10)
        p.add_argument("-o", "--output", default=None)
        a = p.parse_args(argv)
        if a.workers is not None and a.workers <= 0:
            raise UsageError(f"--workers: must be positive, got {a.workers}")
        if a.top <= 0:
            raise UsageError(f"--top: must be positive, got {a.top}")
        model = self._lookup(a.var, "model")
        table = self.session.simulate(a.var, model, workers=a.workers)
        self._store(a.output, table)
        from distlab.notebook.views import ranking_view

        for view in ranking_view(table, a.top):
            display(view)
        return None

    def cmd_pick(self, argv: list[str]) -> Any:
        """Open the strategy picker widget for a model; its .value is the chosen Strategy.

        %distlab pick VAR [-o NAME]
        """
        p = _parser("pick", self.cmd_pick.__doc__)
        p.add_argument("var")
        p.add_argument("-o", "--output", default=None)
        a = p.parse_args(argv)
        model = self._lookup(a.var, "model")
        picker = self.session.picker(a.var, model)
        self._store(a.output, picker)
        display(picker)
        return None

    def cmd_launch(self, argv: list[str]) -> Any:
        """Launch training of a model on the cluster with a strategy.

        %distlab launch VAR --strategy NAME|FILE|VAR [--steps N] [--noblock] [-o NAME]
        """
        p = _parser("launch", self.cmd_launch.__doc__)
        p.add_argument("var")
        p.add_argument("--strategy", "-s", required=True)
        p.add_argument("--steps", type=int, default=100)
        p.add_argument("--noblock", action="store_true")
        p.add_argument("-o", "--output", default=None)
        a = p.parse_args(argv)
        if a.steps <= 0:
            raise UsageError(f"--steps: must be positive, got {a.steps}")
        model = self._lookup(a.var, "model")
        strategy: Any = a.strategy
        if a.strategy in self.shell.user_ns:
            strategy = self.shell.user_ns[a.strategy]
            strategy = getattr(strategy, "value", strategy)  # a StrategyPicker gives its choice
        run = self.session.launch(a.var, model, strategy, steps=a.steps)
        self._store(a.output, run)
        if a.noblock:
            return run
        try:
            run.wait()
        except KeyboardInterrupt:
            run.cancel()
            raise DistlabError(f"run {getattr(run, 'id', '')} cancelled: Ctrl-C stopped it on every worker") from None
        display(run)
        return None

    def cmd_compare(self, argv: list[str]) -> Any:
        """Plot predicted against measured throughput for every run of this notebook.

        %distlab compare
        """
        _parser("compare", self.cmd_compare.__doc__).parse_args(argv)
        runs = self.session.runs_frame()
        from distlab.notebook import plots

        display(runs)
        display(plots.predicted_vs_measured(runs))
        return None

    def cmd_help(self, argv: list[str]) -> Any:
        """Show the subcommands, or the usage of one.

        %distlab help [SUBCOMMAND]
        """
        if argv:
            cmd = self._commands.get(argv[0])
            if cmd is None:
                raise UsageError(f"help: unknown subcommand {argv[0]!r}; one of: {', '.join(self._commands)}")
            print(_dedent(cmd.__doc__))
            return None
        lines = ["%distlab SUBCOMMAND ...  (distlab: plan, simulate and launch distributed training)", ""]
        for name, cmd in self._commands.items():
            first = _dedent(cmd.__doc__).splitlines()
            usage = next((ln for ln in first if ln.startswith("%distlab")), f"%distlab {name}")
            lines.append(f"  {usage:<70} {first[0]}")
        print("\n".join(lines))
        return None


def _dedent(doc: str | None) -> str:
    import textwrap

    if not doc:
        return ""
    head, _, rest = doc.partition("\n")
    return (head.strip() + "\n" + textwrap.dedent(rest)).strip()


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(DistlabMagics)


def unload_ipython_extension(ipython: Any) -> None:
    mm = ipython.magics_manager
    for registry in (mm.magics["line"],):
        registry.pop("distlab", None)
