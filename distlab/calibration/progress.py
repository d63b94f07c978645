"""The calibration's progress bar: one part per call on the workers, moved within it by their ticks."""

from __future__ import annotations

import threading
import time
from typing import Any


class Progress:
    """Calibration's bar (tqdm, shown when ``enabled``): ``total`` parts, each a call on the
    workers or a reference model profiled, named as it starts; a no-op when disabled. Within a
    part it moves by the workers' ticks and, for a part of known length (``start(what,
    expected)``), with the time spent on it, up to nine tenths of the part until it is done."""

    def __init__(self, total: int, desc: str, enabled: bool = True) -> None:
        self._bar = None
        self._moved = 0.0  # of the current part, by ticks from the workers or by its clock
        self._lock = threading.Lock()  # ticks come on the client's event thread, the clock on its own
        self._pacer: threading.Event | None = None
        if enabled and total > 0:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="part", leave=False)

    def start(self, what: str, expected: float | None = None) -> None:
        """Name the part now measured; ``expected``: the seconds it should take."""
        self._stop_pacer()
        if self._bar is None:
            return
        self._bar.set_postfix_str(what)
        if expected is not None and expected > 0:
            stop = self._pacer = threading.Event()
            began = time.monotonic()

            def pace() -> None:
                while not stop.wait(0.5):
                    self._move_to(min(0.9, (time.monotonic() - began) / expected), stop)

            threading.Thread(target=pace, name="distlab-calibration-bar", daemon=True).start()

    def _move_to(self, fraction: float, pacer: threading.Event | None = None) -> None:
        with self._lock:
            if self._bar is None or (pacer is not None and pacer.is_set()) or fraction <= self._moved:
                return
            self._bar.update(fraction - self._moved)
            self._moved = fraction

    def _stop_pacer(self) -> None:
        if self._pacer is not None:
            self._pacer.set()
            self._pacer = None

    def ticks(self, n: int) -> Any:
        """``on_tick`` for a part of ``n`` ticks on the workers (``Lab.run_ranks``): each moves
        the bar ``1/n`` of the part past where it stands, up to nine tenths of it; ``done()``
        completes the part."""
        step = 1.0 / max(n, 1)
        count = [0]

        def on_tick(what: str) -> None:
            count[0] += 1
            self._move_to(min(0.9, count[0] * step))

        return on_tick

    def done(self, parts: int = 1) -> None:
        self._stop_pacer()
        with self._lock:
            if self._bar is not None and parts > 0:
                self._bar.update(parts - self._moved)
                self._bar.n = round(self._bar.n, 6)  # whole parts again after fractions
                self._bar.refresh()
            self._moved = 0.0

    def close(self) -> None:
        self._stop_pacer()
        if self._bar is not None:
            self._bar.close()
