"""Every fenced Python block of README.md and docs/*.md runs as written, in order, per file, in a
fresh kernel, as the cells of one notebook would: an example that stops working fails this test.

A block is one cell (```python, or ```ipython for magic lines). A block that needs what this
machine cannot give (another machine, Slurm, a GPU, root) carries a marker on the line before its
fence, which this test reads and skips with its reason::

    <!-- docs-test: skip "needs a Dask scheduler on another machine" -->

A cell whose last line is a bare expression (no ``;``) must show something, as the notebook would
(a timeline that is not the cell's last expression shows nothing). The cells run in the kernel the
README names for any Jupyter ("Python 3"); the first block of each file defines what it uses.
"""

from __future__ import annotations

import ast
import multiprocessing
import re
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r'^<!--\s*docs-test:\s*skip\s+"([^"]+)"\s*-->\s*$')
LANGUAGES = ("python", "ipython")
CELL_TIMEOUT = 300  # seconds: the README's calibration is the longest cell (about a minute here)


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the fence's line, 1-based
    source: str
    skip: str | None  # the marker's reason

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The Python/IPython fenced blocks of ``path``, in order, each with its skip marker."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if m.group(1) in LANGUAGES:
            before = lines[i - 1] if i else ""
            marker = MARKER.match(before)
            out.append(Block(path, i + 1, "\n".join(lines[i + 1 : j]), marker.group(1) if marker else None))
        i = j + 1
    return out


def documents() -> list[Path]:
    return [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if blocks(p)]


def shows_something(source: str) -> bool:
    """Whether a notebook shows the cell's value: its last statement is an expression not ended by
    ``;`` (magic lines are not Python: they are left to the kernel)."""
    text = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%"))
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return False
    last = text.rstrip().splitlines()[-1].split("#")[0].rstrip()
    return not last.endswith(";")


def test_every_document_with_python_blocks_is_covered_and_markers_parse():
    """The harness itself: the files it runs, and a marker it cannot read is an error, not a pass."""
    docs = documents()
    assert ROOT / "README.md" in docs and len(docs) >= 5, docs
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "docs-test" in line:
                assert MARKER.match(line), f"{path.name}:{number}: unreadable marker {line!r}"


def skipped_blocks() -> list[Block]:
    return [b for p in documents() for b in blocks(p) if b.skip]


@pytest.mark.parametrize("block", skipped_blocks(), ids=Block.where)
def test_marked_block(block: Block):
    pytest.skip(f"{block.where()}: {block.skip}")


# documents run at once, each in its own kernel: a kernel's and a Lab's start wait seconds on
# imports and processes, and this test checks that every block runs and shows, not how fast
DOCUMENTS_AT_ONCE = 2


def _execute(path: str, folder: str) -> tuple[str, str | None]:
    """(pool process) ``path``'s runnable blocks as the cells of one notebook, run in a fresh
    "python3" kernel in ``folder``: the notebook as it ran (JSON) and the error, if a cell failed."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(b.source) for b in blocks(Path(path)) if not b.skip]
    where = {"metadata": {"path": folder}}  # files the examples write land in a scratch folder
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", resources=where)
    error = None
    try:
        client.execute()
    except CellExecutionError as exc:
        error = str(exc)
    return nbformat.writes(nb), error


@pytest.fixture(scope="module")
def executed(request, tmp_path_factory) -> dict[Path, Future]:
    """``{path: future of _execute}`` for every selected document with a runnable block,
    ``DOCUMENTS_AT_ONCE`` at a time in the order of ``documents()``."""
    selected = [
        item.callspec.params["path"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_document_runs_as_written"
    ]
    pool = ProcessPoolExecutor(DOCUMENTS_AT_ONCE, mp_context=multiprocessing.get_context("spawn"))
    out = {
        p: pool.submit(_execute, str(p), str(tmp_path_factory.mktemp(p.stem)))
        for p in selected
        if any(not b.skip for b in blocks(p))
    }
    yield out
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.timeout(900)  # a document waits for the ones before it in the pool (2-5 minutes in all)
@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_document_runs_as_written(path: Path, executed: dict[Path, Future]):
    runnable = [b for b in blocks(path) if not b.skip]
    if not runnable:
        pytest.skip(f"{path.name}: every block is marked ({'; '.join(b.skip or '' for b in blocks(path))})")
    text, error = executed[path].result()
    nb = nbformat.reads(text, as_version=4)
    if error is not None:
        failed = next((b for b, c in zip(runnable, nb.cells) if _errored(c)), None)
        where = failed.where() if failed else path.name
        pytest.fail(f"{where}: the block fails as written:\n{error}", pytrace=False)
    for b, cell in zip(runnable, nb.cells):
        if shows_something(b.source):
            shown = [o for o in cell.outputs if o.output_type in ("execute_result", "display_data", "stream")]
            assert shown, f"{b.where()}: the block's last line should show its value, and nothing was shown"


def _errored(cell) -> bool:
    return any(o.output_type == "error" for o in cell.get("outputs", []))
