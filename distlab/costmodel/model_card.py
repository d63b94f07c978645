"""How a CostModel shows itself: its one-line repr and its HTML card (links, repeatability)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distlab.costmodel.model import CostModel


def describe(cm: CostModel) -> str:
    """``<CostModel microbenchmarks 1a2b..., repeats within 3.1%>``: its source, hash and the
    largest spread of a repeated calibration stage."""
    fp = cm.fingerprint
    src = fp.get("source", "uncalibrated") if fp.get("calibrated") else "uncalibrated"
    spreads = fp.get("repeatability") or []
    repeats = f", repeats within {max(d['spread'] for d in spreads):.1%}" if spreads else ""
    head = f"<CostModel {src} {fp.get('hash', '')}".rstrip()
    return f"{head}{repeats}>"


def card_html(cm: CostModel) -> str:
    """The repr, contention, optimizer cost, the share of hidden communication a step still pays
    (``overlap_loss``), each repeated stage's spread (how far another
    calibration of this cluster would move), whether it was cached, and the links' alpha-beta."""
    prm = cm.params
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{a * 1e6:.1f} "
        f"us</td><td>{1 / b / 1e9 if b else float('inf'):.3f} GB/s</td></tr>"
        for k, (a, b) in sorted(prm.alpha_beta.items())
    )
    repeat = "".join(
        f"<li>{html.escape(d['stage'])}: {d['spread']:.1%} (median of {d['figures']} figures over "
        f"{d['repeats']} repeats; worst {d['worst']:.1%}, {html.escape(str(d['worst_at']))})</li>"
        for d in cm.fingerprint.get("repeatability") or []
    )
    bad = cm.fingerprint.get("unrepeatable")
    return (
        f"<p><b>{html.escape(describe(cm))}</b> contention {prm.contention:.3f}, optimizer "
        f"{prm.optimizer_per_byte * 1e9:.3f} ns/byte (Adam {prm.adam_tensor * 1e6:.1f} us a tensor), "
        f"overlap loss {prm.overlap_loss:.2f}</p>"
        + (f"<p>Repeatability (spread of each stage's repeats):</p><ul>{repeat}</ul>" if repeat else "")
        + (
            f"<p><b>Not cached</b>: the {html.escape(bad['stage'])} stage did not repeat.</p>"
            if isinstance(bad, dict)
            else ""
        )
        + (
            f"<table><tr><th>collective/link</th><th>alpha</th><th>bandwidth</th></tr>{rows}</table>"
            if rows
            else ""
        )
    )
