"""A run's progress bar while ``run.wait()`` blocks: steps and rate as they happen."""

from __future__ import annotations

import time
from typing import Any


class StepBar:
    """Shown after ``after`` seconds of waiting, from the steps the run had already made then, so
    the bar neither jumps nor reports those steps as made in its first instant (it showed
    "19/45 [00:00<00:00, 2951547.26step/s]" when it was set to the steps done)."""

    def __init__(self, label: str, total: int, after: float = 1.0, show: bool = True) -> None:
        self.label, self.total, self.show = label, total, show
        self.due = time.monotonic() + after
        self.bar: Any = None

    def advance(self, done: int) -> None:
        if self.bar is None:
            if not self.show or time.monotonic() < self.due:
                return
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=done, desc=self.label, unit="step", leave=False)
        elif done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def close(self, done: int) -> None:
        if self.bar is not None:
            self.advance(done)
            self.bar.close()
