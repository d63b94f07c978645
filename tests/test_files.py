"""Where distlab keeps what it measured (files.cache_home), and the atomic writes of its files."""

from __future__ import annotations

from pathlib import Path

from distlab.files import cache_home, write_atomic


def test_the_cache_folder_follows_distlab_cache_dir_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("DISTLAB_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_home() == tmp_path / "home" / ".cache" / "distlab"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # set but empty: as unset (the XDG convention)
    assert cache_home() == tmp_path / "home" / ".cache" / "distlab"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_home() == tmp_path / "xdg" / "distlab"
    monkeypatch.setenv("DISTLAB_CACHE_DIR", str(tmp_path / "own"))
    assert cache_home() == tmp_path / "own"


def test_write_atomic_creates_the_folder_and_leaves_no_temporary_file(tmp_path):
    path = write_atomic(tmp_path / "a" / "b.json", "{}")
    assert path.read_text() == "{}" and sorted(p.name for p in Path(path.parent).iterdir()) == ["b.json"]
