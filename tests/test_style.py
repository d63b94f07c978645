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
