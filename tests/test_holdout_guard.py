"""The fresh held-out set stays held out: only its final scoring names ``distlab.holdout_fresh`` in code.

``distlab.holdout`` (the set scored five times and diagnosed on) is a diagnostic set now and
is no longer guarded; ``distlab.holdout_fresh`` replaced it.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\bholdout_fresh\b")
# the module, the test of its shapes (builds each model and takes one step: nothing timed,
# fitted or predicted), this guard and the scorings' count (reads the module's names as text,
# imports nothing), and the one scoring that may look at it
ALLOWED = {
    "distlab/holdout_fresh.py",
    "tests/test_holdout_fresh.py",
    "tests/test_holdout_guard.py",
    "tests/test_holdout_scorings.py",
    "notebooks/bench/prediction-paths.ipynb",
}
# code a benchmark, a calibration or a fit could run from; prose (docs/, READMEs) may name it
SEARCHED = ("distlab/**/*.py", "tests/**/*.py", "notebooks/**/*.ipynb", "datasets/**/*.py", "scripts/**/*.py")


def _python(text: str) -> str:
    """The code of a Python source: comments and docstrings dropped, every other string kept (an
    ``importlib.import_module("distlab.holdout_fresh")`` names it as much as an import does)."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith(("%", "!"))]  # notebook magics
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return text  # unparsable: searched whole, comments and all
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                body[0] = ast.Pass()
    return ast.unparse(tree)


def _code(path: Path) -> str:
    """A file's code: a notebook's code cells, a module's text, less comments and docstrings."""
    text = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        cells = json.loads(text)["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    return _python(text)


def naming_files(root: Path) -> set[str]:
    """Files under ``root`` whose code names the fresh held-out module."""
    files = {f for pattern in SEARCHED for f in root.glob(pattern) if ".venv" not in f.parts}
    return {str(f.relative_to(root)) for f in files if NAME.search(_code(f))}


def test_only_the_final_scoring_names_the_fresh_held_out_models():
    found = naming_files(ROOT)
    assert found <= ALLOWED, (
        f"{sorted(found - ALLOWED)} name distlab.holdout_fresh: the fresh held-out models are scored once, "
        "by notebooks/bench/prediction-paths.ipynb, and never calibrated, fitted, tuned or tested against; "
        "use distlab.heldout's or distlab.holdout's (diagnostic) models for that"
    )
    assert "notebooks/bench/prediction-paths.ipynb" in found  # the search sees a real use


@pytest.mark.parametrize(
    "code",
    [
        "from distlab import holdout_fresh",
        "from distlab import bench, holdout_fresh as h",
        "import distlab.holdout_fresh",
        "from distlab.holdout_fresh import build",
        "import importlib\nm = importlib.import_module('distlab.holdout_fresh')",
        "import distlab as dl\nimport distlab.heldout\nx = dl.holdout_fresh.build('tcn')",
        "%time x = 1\nfrom distlab import holdout_fresh",
    ],
)
def test_a_planted_use_is_caught_in_a_module_a_test_and_a_measurement_script(tmp_path, code):
    for where in (
        "distlab/bench/planted.py",
        "tests/costmodel/test_planted.py",
        "datasets/measurements/x.py",
    ):
        path = tmp_path / where
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code + "\n")
    assert naming_files(tmp_path) == {
        "distlab/bench/planted.py",
        "tests/costmodel/test_planted.py",
        "datasets/measurements/x.py",
    }


def test_a_planted_use_in_a_notebook_is_caught_and_prose_is_not(tmp_path):
    cell = {"cell_type": "code", "metadata": {}, "source": ["from distlab import holdout_fresh\n"]}
    note = {"cell_type": "markdown", "metadata": {}, "source": ["scored by distlab.holdout_fresh"]}
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "a.ipynb").write_text(json.dumps({"cells": [cell, note]}))
    (tmp_path / "notebooks" / "b.ipynb").write_text(json.dumps({"cells": [note]}))
    (tmp_path / "distlab").mkdir()
    (tmp_path / "distlab" / "doc.py").write_text(
        '"""The fresh set is distlab.holdout_fresh."""\n\n# holdout_fresh: see its docstring\nX = 1\n'
    )
    assert naming_files(tmp_path) == {"notebooks/a.ipynb"}
