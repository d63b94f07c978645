"""A real IPython shell with the %distlab magic loaded fresh for each test."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from distlab.notebook.magics import DistlabMagics


@pytest.fixture
def shell():
    sh = InteractiveShell.instance()
    magics = DistlabMagics(sh)
    sh.register_magics(magics)
    sh.distlab_magics = magics
    saved = dict(sh.user_ns)
    yield sh
    if magics.session.current_lab is not None:
        magics.session.stop_lab()
    sh.user_ns.clear()
    sh.user_ns.update(saved)


def run(shell, line: str, capsys) -> tuple[str, str]:
    """Run ``%distlab line`` and return (stdout, stderr)."""
    capsys.readouterr()
    shell.run_line_magic("distlab", line)
    captured = capsys.readouterr()
    return captured.out, captured.err
