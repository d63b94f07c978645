"""The progress bar of ``run.wait()``: no jump to the steps already made, no absurd rate."""

from __future__ import annotations

import io
import time

from distlab.runs.progress import StepBar


def test_the_bar_starts_from_the_steps_already_made_and_rates_only_the_steps_it_saw(monkeypatch):
    import tqdm.auto

    out = io.StringIO()
    real = tqdm.auto.tqdm
    made: list = []

    def capture(*args, **kwargs):
        made.append(real(*args, file=out, mininterval=0, **kwargs))
        return made[-1]

    monkeypatch.setattr(tqdm.auto, "tqdm", capture)
    bar = StepBar("run r1", 45, after=0.0)
    bar.advance(19)  # the bar appears when 19 steps are done: it starts there, counting none of them
    for done in (20, 21, 22):
        time.sleep(0.05)
        bar.advance(done)
    rate = made[0].format_dict["rate"] or (made[0].n - made[0].initial) / made[0].format_dict["elapsed"]
    assert made[0].initial == 19 and made[0].n == 22
    assert rate < 100, f"{rate} steps/s for 3 steps in 0.15 s"  # the old bar said 2951547 steps/s
    bar.close(45)
    assert made[0].n == 45 and "45/45" in out.getvalue()


def test_no_bar_before_its_delay_or_when_the_live_view_shows():
    quiet = StepBar("run r1", 10, after=60.0)
    quiet.advance(3)
    hidden = StepBar("run r2", 10, after=0.0, show=False)
    hidden.advance(3)
    assert quiet.bar is None and hidden.bar is None
    quiet.close(10)
