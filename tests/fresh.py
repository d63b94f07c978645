"""Run Python code in a fresh interpreter: what a first import does, seen from outside this process."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in a new process; the caller asserts on its returncode and output."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
