"""A real IPython shell with the %distlab magic loaded fresh for each test."""

from __future__ import annotations

import contextlib

import pytest
from IPython.core.interactiveshell import InteractiveShell

from distlab.notebook.magics import DistlabMagics


@contextlib.contextmanager
def magic_shell():
    """The IPython shell with a fresh %distlab (one notebook session); afterwards its cluster is
    stopped and the namespace restored."""
    sh = InteractiveShell.instance()
    magics = DistlabMagics(sh)
    sh.register_magics(magics)
    sh.distlab_magics = magics
    saved = dict(sh.user_ns)
    try:
        yield sh, magics
    finally:
        if magics.session.current_lab is not None:
            magics.session.stop_lab()
        sh.user_ns.clear()
        sh.user_ns.update(saved)


@pytest.fixture
def shell():
    with magic_shell() as (sh, _):
        yield sh


def run(shell, line: str, capsys) -> tuple[str, str]:
    """Run ``%distlab line`` and return (stdout, stderr)."""
    capsys.readouterr()
    shell.run_line_magic("distlab", line)
    captured = capsys.readouterr()
    return captured.out, captured.err
