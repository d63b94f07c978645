"""The held-out set stays held out: nothing that calibrates, defaults, fits or tests distlab imports it."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT = re.compile(
    r"^\s*(from\s+distlab\s+import\s+[^\n]*\bholdout\b|import\s+distlab\.holdout\b|from\s+distlab\.holdout\s+import)",
    re.MULTILINE,
)
# the module, the test of its shapes (builds them, fits nothing), the benchmarks scoring on them
# (prediction-paths on one host; two-hosts across hosts and trace-whatif, when their models name them)
ALLOWED = {
    "distlab/holdout.py",
    "tests/test_holdout.py",
    "notebooks/bench/prediction-paths.ipynb",
    "notebooks/bench/two-hosts.ipynb",
    "notebooks/bench/trace-whatif.ipynb",
}


def _code(path: Path) -> str:
    """A file's code: a notebook's code cells, a module's text."""
    text = path.read_text(errors="replace")
    if path.suffix != ".ipynb":
        return text
    cells = json.loads(text)["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _importers() -> set[str]:
    files = [*ROOT.glob("distlab/**/*.py"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("notebooks/**/*.ipynb")]
    return {
        str(f.relative_to(ROOT)) for f in files if f.name != Path(__file__).name and IMPORT.search(_code(f))
    }


def test_only_the_scoring_benchmarks_import_the_held_out_models():
    importers = _importers()
    assert importers <= ALLOWED, (
        f"{sorted(importers - ALLOWED)} import distlab.holdout: the held-out models may be scored on, "
        "never calibrated, fitted, tuned or tested against; use distlab.heldout's models for that"
    )
    assert "notebooks/bench/prediction-paths.ipynb" in importers  # the guard sees real imports


def test_the_pattern_catches_every_spelling():
    for line in (
        "from distlab import holdout",
        "from distlab import bench, holdout",
        "import distlab.holdout as h",
        "from distlab.holdout import build",
    ):
        assert IMPORT.search(line), line
    assert not IMPORT.search("from distlab import heldout")
    assert not IMPORT.search("The held-out set is `distlab.holdout`, scored by prediction-paths")
