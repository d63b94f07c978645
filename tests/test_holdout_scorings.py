"""Every recorded run that scored a held-out model is named in ``distlab.holdout``'s docstring."""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASUREMENTS = ROOT / "datasets" / "measurements"


def _holdout_module() -> tuple[str, set[str]]:
    # read as text, not imported: tests/test_holdout_guard.py allows no test but one to import it
    tree = ast.parse((ROOT / "distlab" / "holdout.py").read_text())
    names = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "NAMES"
    )
    return ast.get_docstring(tree) or "", set(ast.literal_eval(names))


def _scored(path: Path, names: set[str]) -> set[str]:
    data = json.loads(path.read_text())  # a result file's {"rows": [...]}, or a list of records
    rows = data.get("rows", []) if isinstance(data, dict) else data if isinstance(data, list) else []
    return {r["model"] for r in rows if isinstance(r, dict) and r.get("model") in names}


def test_the_holdout_docstring_names_every_file_that_scored_a_held_out_model():
    doc, names = _holdout_module()
    scorers = {p.name for p in sorted(MEASUREMENTS.rglob("*.json")) if _scored(p, names)}
    assert "two-hosts-2026-11-27c.json" in scorers  # the search sees the files it should
    missing = sorted(f for f in scorers if f not in doc)
    assert not missing, (
        f"distlab/holdout.py's docstring does not list what scored the held-out set: {missing}"
    )


def _fresh_names() -> set[str]:
    # read as text: only tests/test_holdout_fresh.py and the final scoring may import the module
    tree = ast.parse((ROOT / "distlab" / "holdout_fresh.py").read_text())
    return set(
        ast.literal_eval(
            next(
                n.value
                for n in tree.body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "NAMES"
            )
        )
    )


def test_the_fresh_held_out_set_is_scored_at_most_once():
    names = _fresh_names()
    assert len(names) >= 4
    scorers = sorted(p.name for p in MEASUREMENTS.rglob("*.json") if _scored(p, names))
    assert len(scorers) <= 1, (
        f"the fresh held-out models were scored by {scorers}: the set is scored once, after the last "
        "model change; a second scoring makes it a diagnostic set (move it as distlab.holdout was)"
    )
