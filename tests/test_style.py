"""The code base keeps the shape STYLE.md asks for: lint-clean, no file past the limit, pure planning."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LIMITS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["distlab"]["style"]
PURE = [
    "distlab/profiling/model_profile.py",
    "distlab/strategy",
    "distlab/topology.py",
    "distlab/costmodel",
    "distlab/whatif",
    "distlab/resources.py",
    "distlab/adaptive",
]
SOURCES = sorted((ROOT / "distlab").rglob("*.py"))


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    done = subprocess.run([ruff, "check", "distlab", "tests"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:]


def test_no_file_past_the_limit():
    long = {
        str(p.relative_to(ROOT)): n
        for p in SOURCES
        if (n := len(p.read_text().splitlines())) > LIMITS["max_file_lines"]
    }
    assert not long, f"split these files: {long}"


def _says_why(node: ast.AST, lines: list[str]) -> bool:
    """A "Long because ..." in the docstring, or in a comment that opens a function's body."""
    if "Long because" in (ast.get_docstring(node) or ""):
        return True
    body = getattr(node, "body", [])
    if isinstance(node, ast.Module) or not body:
        return False
    start = body[1].lineno if ast.get_docstring(node) and len(body) > 1 else body[0].lineno
    head = lines[node.lineno : start]  # the signature's end, the docstring, comments before the code
    return any(line.strip().startswith("# Long because") for line in head)


def test_a_long_file_or_function_says_why_at_its_top():
    """A file past ``explain_file_lines`` or a function past ``explain_function_lines`` says at its
    top why it stays one piece ("Long because ..." in its docstring, or a function's opening
    comment where the docstring is for users), or is split."""
    unexplained = []
    for p in SOURCES:
        text = p.read_text()
        tree = ast.parse(text)
        name = str(p.relative_to(ROOT))
        if len(text.splitlines()) > LIMITS["explain_file_lines"] and not _says_why(tree, []):
            unexplained.append(name)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > LIMITS["explain_function_lines"] and not _says_why(node, text.splitlines()):
                    unexplained.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert not unexplained, f"split these or say why at their top: {unexplained}"


def test_ruff_format_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e .[dev])")
    done = subprocess.run(
        [ruff, "format", "--check", "distlab", "tests"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:]


def test_every_module_opens_with_a_docstring():
    missing = [
        str(p.relative_to(ROOT))
        for p in SOURCES
        if p.stat().st_size and ast.get_docstring(ast.parse(p.read_text())) is None
    ]
    assert not missing, missing


@pytest.mark.parametrize("path", PURE)
def test_planning_never_imports_dask_or_torch_distributed(path):
    files = [ROOT / path] if path.endswith(".py") else sorted((ROOT / path).rglob("*.py"))
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                assert not name.startswith(("dask", "distributed", "torch.distributed")), (
                    f"{f.name} imports {name}"
                )


def test_the_readme_layout_lists_every_module_of_the_package():
    """The README's layout section names what ``ls distlab`` shows: packages with a slash, modules by file."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## Layout") :].split("```")[1]
    lines = block.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("distlab/"))
    named = []
    for line in lines[start:]:
        if line[:1].strip() and not line.startswith("distlab/"):
            break  # the next top-level folder
        named += [w for w in line.removeprefix("distlab/").split() if w.endswith("/") or w.endswith(".py")]
    actual = {
        p.name + ("/" if p.is_dir() else "")
        for p in (ROOT / "distlab").iterdir()
        if not p.name.startswith("__") and p.name != "py.typed"
    }
    assert set(named) == actual


def test_every_cost_param_has_its_own_line_of_documentation():
    tree = ast.parse((ROOT / "distlab" / "costmodel" / "params.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CostParams")
    body = cls.body
    undocumented = [
        n.target.id
        for i, n in enumerate(body)
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.target, ast.Name)
        and not (
            i + 1 < len(body)
            and isinstance(body[i + 1], ast.Expr)
            and isinstance(body[i + 1].value, ast.Constant)
        )
    ]
    assert not undocumented, f"document these CostParams fields: {undocumented}"


# Import rules between distlab's rooms (a top-level package or module each); docs/design.md says why.
# The facade `distlab/__init__.py` is not a room others climb to: `import distlab as dl` inside a
# function reaches the public names, and IPython needs its %load_ext entry point there.
FACADE = "distlab/__init__"
# the display hooks a Run keeps (Run.plot, Run.live, Run.timeline, Run.save_trace), as dask's
# Cluster keeps _repr_html_ and _widget
DISPLAY_HOOKS = {
    ("distlab.runs.run", "distlab.notebook.live"),
    ("distlab.runs.run", "distlab.notebook.timeline"),
    ("distlab.whatif.result", "distlab.notebook.timeline"),  # WhatIf.timeline, drawn like Run.timeline
}
# the rooms that drive a run (above the runtime and the simulator)
DRIVING = {"lab.py", "runs/", "cluster/", "calibration/", "native_tf/", "torch_route.py", "notebook/"}
# what each lower room may not import (the rooms above it)
ABOVE = {
    "cluster/": {
        "lab.py",
        "runs/",
        "calibration/",
        "native_tf/",
        "torch_route.py",
        "notebook/",
        "bench/",
        "cli.py",
    },
    "runs/": {"lab.py", "calibration/", "native_tf/", "torch_route.py", "notebook/", "bench/", "cli.py"},
    "calibration/": {"lab.py", "native_tf/", "torch_route.py", "notebook/", "bench/", "cli.py"},
    "native_tf/": {"lab.py", "notebook/", "bench/", "cli.py"},
    "torch_route.py": {"lab.py", "notebook/", "bench/", "cli.py"},
    "lab.py": {"notebook/", "bench/", "cli.py"},
    # a replay reads traces as data and prices them with the simulator: it never drives a run
    "whatif/": DRIVING | {"runtime/", "bench/", "cli.py"},
    "runtime/": DRIVING | {"costmodel/", "whatif/"},  # the runtime and the simulator do not know each other
    "costmodel/": DRIVING | {"runtime/", "whatif/"},
    "resources.py": {"strategy/", "topology.py", "costmodel/", "runtime/", "profiling/", "adaptive/"},
    "topology.py": {"strategy/", "resources.py", "costmodel/", "runtime/", "profiling/", "adaptive/"},
}


def _imports() -> list[tuple[str, str, str]]:
    """(importing module, imported module, imported name) for every import of distlab's own."""
    out = []
    for path in (ROOT / "distlab").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("distlab"):
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    known = (ROOT / sub.replace(".", "/")).is_dir() or (
                        ROOT / f"{sub.replace('.', '/')}.py"
                    ).exists()
                    out.append((module, sub if known else node.module, alias.name))
            elif isinstance(node, ast.Import):
                out += [(module, a.name, "") for a in node.names if a.name.startswith("distlab")]
    return out


def _room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return FACADE
    return parts[1] + ("/" if (ROOT / "distlab" / parts[1]).is_dir() else ".py")


def test_imports_keep_the_layers_no_circle_spans_two_rooms_and_no_private_name_crosses_a_file():
    edges: dict[str, set[str]] = {}
    wrong, private = [], []
    for src, dst, name in _imports():
        a, b = _room(src), _room(dst)
        if name.startswith("_") and not name.startswith("__") and src != dst:
            private.append(f"{src} imports {dst}.{name}")
        if a == b or b == FACADE or (src, dst) in DISPLAY_HOOKS or a == FACADE:
            continue
        edges.setdefault(a, set()).add(b)
        if b in ABOVE.get(a, ()):
            wrong.append(f"{src} imports {dst} (a {a} module may not import {b})")
    assert not wrong, wrong
    assert not private, private
    # no circle between rooms: a depth-first search finds no edge back to a room on its path
    state: dict[str, int] = {}
    circles = []

    def visit(room: str, path: list[str]) -> None:
        state[room] = 1
        for nxt in sorted(edges.get(room, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[room] = 2

    for room in sorted(edges):
        if room not in state:
            visit(room, [room])
    assert not circles, circles


def _private_attributes() -> tuple[dict[str, set[str]], list[tuple[str, int, str, str]]]:
    """Per file, the private attributes and methods distlab's own classes define there
    (``self._x = ...``, ``def _x``); and every ``obj._x`` read whose ``obj`` is not ``self`` or
    ``cls`` (file, line, the object as written, the name)."""
    defined: dict[str, set[str]] = {}
    reads = []
    for path in (ROOT / "distlab").rglob("*.py"):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        own = defined.setdefault(rel, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in ast.walk(node):
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith(
                        "_"
                    ):
                        own.add(item.name)
                    if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name):
                        if item.value.id in ("self", "cls") and isinstance(item.ctx, ast.Store):
                            own.add(item.attr)
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not node.attr.endswith("_")  # IPython's display protocol (_repr_html_) is public
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                reads.append((rel, node.lineno, ast.unparse(node.value), node.attr))
    return defined, reads


def test_no_code_reaches_into_another_files_objects_private_attributes():
    """A private attribute or method of a distlab class is read only in the file that defines it
    (a third-party library's private names, which distlab does not define, are not checked here)."""
    defined, reads = _private_attributes()
    everywhere = set().union(*defined.values())
    crossing = [
        f"{rel}:{line} reads {obj}.{name}"
        for rel, line, obj, name in reads
        if name in everywhere and name not in defined[rel]
    ]
    assert not crossing, crossing
