"""``%%distlab run``: the cell's code as the body of ``train(ctx)``, run on every rank through
``lab.run`` (ipyparallel's ``%%px``, with distlab's strategies, card and live view); and what it
shares with ``%distlab launch`` (the ``--strategy`` option, following the run).

The cell becomes ``def cell(ctx): <the cell>``. The notebook variables it reads are found by name
(``symtable`` for the scopes, the order Python evaluates a statement in for a name the cell also
binds) and sent by value with the function (cloudpickle), each checked first so that one that
cannot travel is named in one line. A name the cell reads before it binds it (``model, opt, loader
= ctx.prepare(model, opt, loader)``) is the notebook's value, rebound on the ranks only.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import itertools
import linecache
import os
import symtable
import traceback
from collections.abc import Callable
from typing import Any

from IPython.display import display

from distlab.errors import DistlabError, LaunchError, did_you_mean, match_name

_CELLS = itertools.count(1)  # each cell run gets its own file name: tracebacks and linecache tell them apart
# names IPython puts in the namespace: never sent, even when a cell reads them
_IPYTHON_NAMES = {"In", "Out", "exit", "quit", "get_ipython", "open"}


class CellVariableError(DistlabError):
    """A notebook variable the ``%%distlab run`` cell reads cannot be sent to the workers."""


class CellCodeError(DistlabError):
    """The ``%%distlab run`` cell is not code ``train(ctx)`` can be made of."""


class RunMagic:
    """The runs' part of ``DistlabMagics`` (magics.py, which gives it ``shell``, ``session``, ``_store``
    and ``_cell``: the cell's text, None on a line): ``%%distlab run`` and the pieces
    ``%distlab launch`` shares with it."""

    shell: Any
    session: Any
    _cell: str | None
    _store: Callable[[str | None, Any], None]

    def cmd_run(self, argv: list[str]) -> Any:
        """Train your own loop: the cell is the body of train(ctx) on every rank, under a
        strategy (lab.run); the run goes in a variable (-o NAME, default run).

        %%distlab run [--strategy NAME|FILE|VAR] [--workers N] [--timeout S] [--seed N]
            [--trace] [--noblock] [-o NAME]

        The cell calls model, opt, loader = ctx.prepare(model, opt, loader) once, then
        loops (distlab.TrainContext: ctx.report(loss=...), ctx.epochs(n), ctx.step). It is
        a function body: `return X` ends it, and rank 0's X is run.result; run.model is the
        trained model. The notebook variables it reads are sent by value (cloudpickle):
        what it assigns or changes stays on the ranks, and its print() output goes to the
        workers' log. --strategy: AllReduce (default), a builder, a JSON file or a notebook
        variable; --workers N: the first N ranks; --trace: run.timeline().
        """
        from distlab.notebook.magics import UsageError, check_option, make_parser

        p = make_parser("run")
        p.add_argument("--strategy", "-s", default="AllReduce")
        p.add_argument("--workers", type=int, default=None)
        p.add_argument("--timeout", type=float, default=None)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--trace", action="store_true")
        p.add_argument("--noblock", action="store_true")
        p.add_argument("-o", "--output", default="run")
        a = p.parse_args(argv)
        if self._cell is None:
            raise UsageError("run takes a cell: %%distlab run [options] on its first line, your loop below")
        if not self._cell.strip():
            raise UsageError(
                "%%distlab run: the cell is empty; write your training loop below the magic's line"
            )
        check_option("--workers", a.workers)
        if a.timeout is not None and not a.timeout > 0:
            raise UsageError(f"--timeout {a.timeout:g}: a timeout is a number of seconds > 0")
        if not a.output.isidentifier():
            raise UsageError(f"-o {a.output!r}: not a Python name; e.g. -o run2")
        strategy = self._strategy(a.strategy)
        train, filename = cell_function(self._cell, self.shell.user_ns)
        lab = self.session.lab()
        if a.workers is not None and a.workers > lab.resources.world:
            raise UsageError(
                f"--workers {a.workers}: the cluster has {lab.resources.world} workers; pass --workers "
                f"{lab.resources.world} or fewer, or start more (%distlab cluster local {a.workers})"
            )
        if lab.cost_model is None:  # predicted as %distlab launch predicts: the default cost model
            from distlab.costmodel import CostModel

            lab.cost_model = CostModel.default()
        try:
            run = lab.run(train, strategy, a.workers, a.timeout, seed=a.seed, trace=a.trace)
        except LaunchError as exc:
            raise LaunchError(in_kernel(exc, filename)) from None
        self.session.runs.append(run)
        run.var_name = a.output
        self._store(a.output, run)
        print(
            f"run {run.id} is in `{a.output}`: {a.output}.model is the trained model once it finishes, "
            f"{a.output}.result the cell's return value, {a.output}.metrics its steps"
        )
        return self._follow(run, a.noblock)

    def _strategy(self, name: str) -> Any:
        """--strategy: a notebook variable (a Strategy, a picker), a JSON file, else a builder name
        (checked here, before any cluster starts)."""
        if name in self.shell.user_ns:
            strategy = self.shell.user_ns[name]
            return getattr(strategy, "value", strategy)  # a StrategyPicker gives its choice
        if os.path.exists(name) or name.endswith(".json"):
            return name
        from distlab.strategy import builders

        known = list(builders())
        builder = match_name(name, known)
        if builder is None:
            from distlab.notebook.magics import UsageError

            raise UsageError(
                f"--strategy {name!r}: no builder, notebook variable or file of that name"
                f"{did_you_mean(name, known)} (builders: {', '.join(known)})"
            )
        return builder

    def _follow(self, run: Any, noblock: bool) -> None:
        """Show ``run`` as it trains (the live view in a notebook, else a bar) and wait for it unless
        ``noblock``; Ctrl-C cancels it on every worker."""
        if getattr(self.shell, "kernel", None) is not None:
            run.live()  # in a notebook: drawn as it trains, and after the cell returns (--noblock)
        if noblock:
            return None
        try:
            run.wait(progress=run.view is None)
        except KeyboardInterrupt:
            run.cancel()
            raise DistlabError(f"run {run.id} cancelled: Ctrl-C stopped it on every worker") from None
        finally:
            if run.view is not None:
                run.view.join()  # its final drawing is in this cell's output before the cell ends
            else:
                display(run)
        return None


def cell_function(cell: str, ns: dict[str, Any]) -> tuple[Callable[[Any], Any], str]:
    """``def cell(ctx): <cell>`` over copies of the notebook variables it reads, and its file name;
    one error naming a variable that cannot be sent, or one the notebook does not define. Its line
    numbers are the notebook's: line 1 is the ``%%distlab run`` line, the cell's code from line 2."""
    filename = f"<%%distlab run cell {next(_CELLS)}>"
    try:
        body = ast.parse(cell, filename).body
    except SyntaxError as exc:
        raise CellCodeError(_syntax(exc, 1)) from None
    for stmt in body:
        ast.increment_lineno(stmt, 1)
    fn = ast.parse("def cell(ctx):\n    pass").body[0]
    assert isinstance(fn, ast.FunctionDef)
    fn.body = body or fn.body
    reads, rebinds, unknown = notebook_reads(fn, ns)
    if unknown:
        names = [k for k in ns if not k.startswith("_") and k not in _IPYTHON_NAMES]
        raise CellCodeError(
            f"%%distlab run: the cell reads `{unknown[0]}`, which is not defined in this notebook"
            f"{did_you_mean(unknown[0], names)}; define it in a cell before, or in this one"
        )
    if rebinds:  # read first, then bound: the notebook's value, rebound in the ranks' copy
        fn.body.insert(0, ast.Global(names=sorted(rebinds)))
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    try:
        code = compile(module, filename, "exec")
    except SyntaxError as exc:
        raise CellCodeError(_syntax(exc, 0)) from None
    values = {name: ns[name] for name in sorted(reads)}
    for name, value in values.items():
        _check_sendable(name, value)
    lines = ["%%distlab run\n", *cell.splitlines(True)]
    linecache.cache[filename] = (len(cell), None, lines, filename)  # the kernel's tracebacks show the code
    scope: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins, **values}
    local: dict[str, Any] = {}
    exec(code, scope, local)  # noqa: S102 - the user's own cell, as IPython runs it
    train = local["cell"]
    if inspect.isgeneratorfunction(train):
        raise CellCodeError(
            "%%distlab run: the cell yields, so it would be a generator; a training loop returns "
            "(ctx.report(...) sends values as it goes)"
        )
    return train, filename


def notebook_reads(fn: ast.FunctionDef, ns: dict[str, Any]) -> tuple[set[str], set[str], list[str]]:
    """(the notebook variables ``fn`` reads, those of them its body also binds, the names it reads
    that neither the notebook nor Python's builtins define)."""
    table = symtable.symtable(ast.unparse(fn), "<cell>", "exec").get_children()[0]
    free: set[str] = set()
    declared: set[str] = set()  # the cell's own `global x` names: bound on the ranks, maybe not here

    def walk(t: symtable.SymbolTable) -> None:
        for s in t.get_symbols():
            if s.is_declared_global() and s.is_assigned():
                declared.add(s.get_name())
            if s.is_global() and s.is_referenced():
                free.add(s.get_name())
        for child in t.get_children():
            walk(child)

    walk(table)
    first = _FirstUse()
    for stmt in fn.body:
        first.visit(stmt)
    bound = {s.get_name() for s in table.get_symbols() if s.is_local() and not s.is_parameter()}
    rebinds = {n for n in bound if first.read.get(n) and n in ns and n not in _IPYTHON_NAMES}
    reads = {n for n in free if n in ns and n not in _IPYTHON_NAMES} | rebinds
    unknown = sorted(n for n in free - declared if n not in ns and not hasattr(builtins, n))
    return reads, rebinds, unknown


class _FirstUse(ast.NodeVisitor):
    """One scope's names in the order Python evaluates them (the value before the target it is
    bound to, a loop's iterable before its variable): ``read[name]`` is whether its first use reads it.
    Nested functions, lambdas and comprehensions add only what the scope itself evaluates."""

    def __init__(self) -> None:
        self.read: dict[str, bool] = {}

    def _use(self, name: str, read: bool) -> None:
        self.read.setdefault(name, read)

    def _all(self, nodes: Any) -> None:
        for node in nodes:
            if node is not None:
                self.visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        self._use(node.id, not isinstance(node.ctx, ast.Store))  # a Del needs the value too

    def visit_Assign(self, node: ast.Assign) -> None:
        self._all([node.value, *node.targets])

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._all([node.value, node.target])

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self._use(node.target.id, True)
        self._all([node.target, node.value])

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._all([node.value, node.target])

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self._all([node.iter, node.target, *node.body, *node.orelse])

    visit_AsyncFor = visit_For

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self._all([*node.decorator_list, *node.args.defaults, *node.args.kw_defaults])
        self._use(node.name, False)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._all([*node.decorator_list, *node.bases, *(k.value for k in node.keywords)])
        self._use(node.name, False)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._all([*node.args.defaults, *node.args.kw_defaults])

    def _comprehension(self, node: Any) -> None:
        self.visit(node.generators[0].iter)  # the rest runs in the comprehension's own scope

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name != "*":
                self._use(alias.asname or alias.name.split(".")[0], False)

    visit_ImportFrom = visit_Import

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        self._all([node.type])
        if node.name:
            self._use(node.name, False)
        self._all(node.body)


class _Discard:
    """A file that keeps nothing: a variable is pickled to learn whether it can be, not kept."""

    def write(self, data: Any) -> int:
        return len(data)


def _check_sendable(name: str, value: Any) -> None:
    import cloudpickle

    try:
        cloudpickle.dump(value, _Discard())
    except Exception as exc:  # noqa: BLE001 - whatever pickling raises, the variable is named
        first = (str(exc).splitlines() or [""])[0][:160]
        raise CellVariableError(
            f"%%distlab run: the cell reads `{name}`, a {type(value).__name__} that cannot be sent to the "
            f"workers ({type(exc).__name__}: {first}); create it inside the cell instead"
        ) from None


def _syntax(exc: SyntaxError, offset: int) -> str:
    line = (exc.text or "").strip()
    hint = ""
    if line.startswith(("%", "!")):
        hint = " (the cell runs on the workers as plain Python: no %magics or !commands)"
    return (
        f"%%distlab run: line {(exc.lineno or 0) + offset} of the cell: {exc.msg}"
        + (f" ({line})" if line else "")
        + hint
    )


def in_kernel(exc: LaunchError, filename: str) -> str:
    """``lab.run``'s error, said of the cell when the cell raised it in the kernel (before
    ``ctx.prepare``): the exception and the cell's line it came from."""
    cause = exc.__cause__
    frames = [f for f in traceback.extract_tb(cause.__traceback__) if f.filename == filename] if cause else []
    if not frames:
        return str(exc)
    first = (str(cause).splitlines() or [""])[0][:160]
    text = (frames[-1].line or "").strip()
    return (
        f"%%distlab run: the cell raised {type(cause).__name__}: {first} at line {frames[-1].lineno}"
        + (f" ({text[:80]})" if text else "")
        + ", in the kernel before ctx.prepare (the cell runs there once, up to ctx.prepare, to see what "
        "it trains); fix it and run again"
    )
