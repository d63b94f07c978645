"""A script that starts a Lab at its top level (no ``if __name__ == "__main__":``) gets one
LaunchError naming the guard, not Dask's "Nanny failed to start" and a page of traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_lab_at_a_scripts_top_level_is_told_about_the_guard(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import distlab as dl\ntry:\n    lab = dl.Lab(workers=1, timeout=30)\nexcept dl.DistlabError as "
        "exc:\n    print('DISTLAB:', type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=150, cwd=tmp_path
    )
    said = [line for line in out.stdout.splitlines() if line.startswith("DISTLAB:")]
    assert said and said[0].startswith("DISTLAB: LaunchError"), out.stdout[-2000:] + out.stderr[-2000:]
    assert 'if __name__ == "__main__":' in said[0]
