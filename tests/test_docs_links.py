"""No link in README.md or docs/ leaves the repository: a reader of a clone can follow each one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
# a path in code spans that climbs out of its folder, as `../shared/x.md` did: not a link, but a reader
# is sent there all the same
CLIMB = re.compile(r"`(\.\./[^`\s]+)`")
EXTERNAL = ("http://", "https://", "mailto:")


def _prose(path: Path) -> str:
    return FENCE.sub("", path.read_text())


def _slug(heading: str) -> str:
    # GitHub's anchors: lower case, punctuation dropped (hyphens kept), spaces to hyphens
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {_slug(m[1]) for m in re.finditer(r"^#+\s+(.*)$", _prose(path), re.MULTILINE)}


def _targets(path: Path) -> list[str]:
    prose = _prose(path)
    return [*LINK.findall(prose), *REFERENCE.findall(prose)]


def _broken(doc: Path, target: str) -> str | None:
    """Why ``target``, linked from ``doc``, cannot be followed in a clone; None when it can."""
    if target.startswith(EXTERNAL):
        return None
    if ":" in target.split("/")[0]:
        return f"{target}: a scheme a clone cannot follow"
    where, _, anchor = target.partition("#")
    if where.startswith("/"):
        return f"{target}: an absolute path, outside the repository"
    file = (doc.parent / where).resolve() if where else doc
    if not file.is_relative_to(ROOT):
        return f"{target}: leaves the repository"
    if not file.exists():
        return f"{target}: no such file in the repository"
    if anchor and file.suffix == ".md" and anchor not in _anchors(file):
        return f"{target}: {file.relative_to(ROOT)} has no heading #{anchor}"
    return None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(doc):
    assert _targets(doc) or doc.name != "README.md"  # the parser still sees the README's links
    broken = [why for t in _targets(doc) if (why := _broken(doc, t))]
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_path_named_in_the_prose_climbs_out_of_the_repository(doc):
    named = [(p, (doc.parent / p).resolve()) for p in CLIMB.findall(_prose(doc))]
    outside = [p for p, file in named if not file.is_relative_to(ROOT) or not file.exists()]
    assert not outside, f"{doc.relative_to(ROOT)} sends readers where a clone has nothing: {outside}"


def test_the_check_catches_a_link_out_of_the_repository():
    assert _broken(ROOT / "docs" / "multi-host.md", "../../shared/research/wave3-anchors.md")
    assert _broken(ROOT / "docs" / "multi-host.md", "../shared/research/wave3-anchors.md")
    assert _broken(ROOT / "README.md", "docs/design.md#no-such-heading")
    assert _broken(ROOT / "README.md", "docs/design.md") is None
    assert _broken(ROOT / "README.md", "https://ui.perfetto.dev") is None
