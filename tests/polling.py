"""``poll_for``: the one way a test waits for something to happen, always bounded."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def poll_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Call ``predicate`` every ``interval`` seconds until it returns something true (returned);
    fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(interval)
