"""The ranking a notebook shows: every candidate, a single-process baseline, exact ties once.

``%distlab simulate``, ``%distlab pick`` and the picker's list all read ``ranking``; the table
a user sees comes from ``display_table`` (rounded numbers with units, no internal index).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

SINGLE_PROCESS = "1 process (no distribution)"
# two predictions this close (relative) are the same prediction: the strategies differ in nothing
# the cost model sees (fp16 and bf16 move the same bytes; gossip graphs that coincide at 2 ranks)
TIE = 1e-9
GOODPUT = {"goodput"}  # compared too when present: plans of one speed and different statistical costs


def single_process(profile: Any, resources: Any) -> Any:
    """The model trained by one process on one worker (a Strategy of one rank): the baseline
    every plan must beat."""
    from distlab import strategy as st

    one = resources.with_world(1) if resources.world != 1 else resources
    return st.build("AllReduce", profile, one, batch_size=profile.batch_size)


def ranking(
    cost_model: Any, profile: Any, resources: Any, candidates: Sequence[Any], staleness_cost: Any = None
) -> Any:
    """``cost_model.rank`` of ``candidates`` plus the single-process row, best first, with
    strategies of exactly equal predictions merged into one row ("AllReduce(fp16) = AllReduce(bf16)").

    ``table.attrs["single_wins"]`` is True when one process is predicted faster than every
    distributed strategy; ``table.attrs["single_note"]`` says so in a sentence (else ""), and
    ``table.attrs["note"]`` is that and the cost model's notes (``CostModel.notes``) in one line.
    ``staleness_cost``: g per staleness (``Lab.probe_staleness``): best first by goodput then.
    Each row's ``note`` says what its figure leaves out: a stale or asynchronous plan without a
    measured g carries "convergence not counted: lab.probe_staleness..." (ranked by throughput
    without ``staleness_cost``; unpriced, goodput NaN and after every priced row, with it).
    """
    import pandas as pd

    table = cost_model.rank(profile, resources, list(candidates), staleness_cost=staleness_cost)
    one = resources.with_world(1) if resources.world != 1 else resources
    base = cost_model.rank(profile, one, [single_process(profile, resources)])
    base["strategy"], base["builder"] = SINGLE_PROCESS, "none"
    rows = pd.concat([table, base], ignore_index=True)
    key = "goodput" if staleness_cost and "goodput" in table else "throughput"
    if key == "goodput":  # one process steps synchronously: its goodput is its throughput
        alone = rows["strategy"] == SINGLE_PROCESS  # an unpriced plan's NaN stays NaN (ranked last)
        rows.loc[alone, "goodput"] = rows.loc[alone, "throughput"]
    rows = rows.sort_values(key, ascending=False, kind="stable", na_position="last").reset_index(drop=True)
    rows = _merge_ties(rows)
    rows["index"] = range(len(rows))
    distributed = rows[rows["strategy"] != SINGLE_PROCESS]
    single = float(base["throughput"].iloc[0])
    wins = bool(len(distributed) == 0 or single > float(distributed["throughput"].max()))
    rows.attrs["single_wins"] = wins
    rows.attrs["notes"] = table.attrs.get("notes", ())  # the cost model's, and what the order leaves out
    rows.attrs["single_note"] = wins_note = (
        f"one process is predicted fastest ({single:,.0f} samples/s, best distributed "
        f"{float(distributed['throughput'].max()):,.0f}/s): for this model on this cluster, do not distribute"
        if wins and len(distributed)
        else ""
    )
    rows.attrs["note"] = "; ".join(n for n in (wins_note, *rows.attrs["notes"]) if n)
    return rows


def _merge_ties(rows: Any) -> Any:
    """Consecutive rows (sorted by throughput) whose step time and breakdown agree within TIE: one row."""
    keep, names = [], []
    for i, r in rows.iterrows():
        if keep:
            k = rows.loc[keep[-1]]
            same = str(r.get("note", "")) == str(k.get("note", "")) and all(
                _close(float(r[c]), float(k[c]))
                for c in (
                    "throughput",
                    "step_time",
                    "compute",
                    "comm",
                    "optimizer",
                    *GOODPUT.intersection(rows),
                )
            )
            # an adaptive strategy is its own row: its batch changes as it trains (goodput tells it apart)
            adaptive = (r.get("builder") == "AdaptiveBatch") != (k.get("builder") == "AdaptiveBatch")
            if (
                same
                and not adaptive
                and int(r["world"]) == int(k["world"])
                and SINGLE_PROCESS not in (r["strategy"], k["strategy"])
            ):
                names[-1].append(str(r["strategy"]))
                continue
        keep.append(i)
        names.append([str(r["strategy"])])
    out = rows.loc[keep].reset_index(drop=True)
    out["strategy"] = [" = ".join(n) for n in names]
    return out


def _close(a: float, b: float) -> bool:
    """Equal within TIE; two unpriced goodputs (NaN) are equal too."""
    return (a != a and b != b) or abs(a - b) <= TIE * max(abs(b), 1e-12)


def short_label(name: str, width: int = 44) -> str:
    """A chart label for a ranking row: merged ties as the first name and how many more
    (``AllReduce(compressor=fp16) (+1 equal)``), at most ``width`` characters."""
    parts = name.split(" = ")
    label = parts[0] + (f" (+{len(parts) - 1} equal)" if len(parts) > 1 else "")
    return label if len(label) <= width else label[: width - 1] + "\u2026"


def display_table(table: Any, top: int = 10) -> Any:
    """What a person reads: strategy, workers, samples/s as integers, times in ms, no index; the
    top ``top`` rows and, below them when it ranks lower, the single-process row."""
    import pandas as pd

    head = top_with_baseline(table, top)
    cols = {
        "strategy": head["strategy"].astype(str),
        "workers": head["world"].astype(int),
        "samples/s": head["throughput"].round().astype(int),
        "step (ms)": (head["step_time"] * 1e3).round(1),
        "compute (ms)": (head["compute"] * 1e3).round(1),
        "comm (ms)": (head["comm"] * 1e3).round(1),
        "optimizer (ms)": (head["optimizer"] * 1e3).round(1),
    }
    if "basis" in head:  # what the compute came from: the model's measured step or its profile
        cols["from"] = head["basis"].astype(str)
    if "goodput" in head:  # an unpriced plan's (NaN) shows as "-": its note says what to probe
        cols["goodput"] = head["goodput"].map(lambda v: f"{v:,.0f}" if v == v else "-")
    if "note" in head and head["note"].fillna("").astype(bool).any():
        cols["note"] = head["note"].fillna("").astype(str)
    from distlab.notebook.views import Table

    return Table(pd.DataFrame(cols))


def top_with_baseline(table: Any, top: int) -> Any:
    """The first ``top`` rows of a ranking, plus the single-process row when it ranks below them."""
    import pandas as pd

    head = table.head(top)
    single = table[table["strategy"] == SINGLE_PROCESS]
    if len(single) and SINGLE_PROCESS not in set(head["strategy"]):
        head = pd.concat([head, single])
    return head
