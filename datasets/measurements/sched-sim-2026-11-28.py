"""Replay the Pollux OSDI'21 artifact's eight workloads through distlab.sched against its JCTs.

Usage: python datasets/measurements/sched-sim-2026-11-28.py [--workers 2] [--workloads 1 2 ...]
Writes datasets/measurements/sched-sim-2026-11-28.json (see the card in datasets/measurements/README.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import time
from pathlib import Path

OUT = Path(__file__).with_suffix(".json")


def run(args: tuple[int, str]) -> dict:
    from distlab.sched import artifact

    number, policy = args
    start = time.perf_counter()
    result = artifact.replay(number, policy)
    return {
        "workload": number,
        "policy": policy,
        **result.summary(),
        "restarts": int(result.jobs.restarts.sum()),
        "refused": result.refused,
        "wall_s": round(time.perf_counter() - start, 1),
    }


def main() -> None:

    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workloads", type=int, nargs="*", default=list(range(1, 9)))
    parser.add_argument("--policies", nargs="*", default=["goodput", "fifo"])
    parser.add_argument("--rewrite", action="store_true", help="re-derive the summary from the JSON's rows")
    opts = parser.parse_args()
    if opts.rewrite:
        done = json.loads(OUT.read_text())
        rows = done["rows"]
        write(rows, [(int(t.split("-")[-1]), t.split()[0]) for t in done["planned"]])
        return
    # workload by workload, each policy beside the other, and the JSON rewritten after every run, so
    # a run cut short still records what finished
    tasks = [(n, p) for n in opts.workloads for p in opts.policies]
    rows: list[dict] = []
    with multiprocessing.Pool(opts.workers) as pool:
        for row in pool.imap_unordered(run, tasks, chunksize=1):
            rows.append(row)
            write(rows, tasks)
            print(row, flush=True)


def write(rows: list[dict], tasks: list[tuple[int, str]]) -> None:
    from distlab.sched import artifact

    ref = artifact.reference()
    for row in rows:
        key = f"workload-{row['workload']}"
        for name in ("pollux", "tiresias", "optimus"):
            row[f"artifact_{name}_avg_jct"] = ref[name]["avgs"][key]
            row[f"artifact_{name}_p99_jct"] = ref[name]["p99"][key]
        if row["policy"] == "goodput":
            row["error_vs_artifact_pollux"] = row["avg_jct"] / ref["pollux"]["avgs"][key] - 1
    goodput = [r for r in rows if r["policy"] == "goodput"]
    mean = sum(r["avg_jct"] for r in goodput) / max(len(goodput), 1)
    ref_mean = sum(ref["pollux"]["avgs"][f"workload-{r['workload']}"] for r in goodput) / max(len(goodput), 1)
    summary = {
        "what": "distlab.sched.artifact.replay(n, policy) on the Pollux artifact's workloads (1.0x load), "
        "16 hosts x 4 GPUs, 60 s interval, 30 s restart",
        "target": "goodput policy's average JCT within 10% of the artifact's Pollux result, per workload",
        "planned": [f"{p} workload-{n}" for n, p in tasks],
        "finished": len(rows),
        "goodput_mean_avg_jct": mean if goodput else None,
        "artifact_pollux_mean_avg_jct_same_workloads": ref_mean if goodput else None,
        "mean_error": mean / ref_mean - 1 if goodput else None,
        "max_abs_error": max((abs(r["error_vs_artifact_pollux"]) for r in goodput), default=None),
        "met_on_finished": all(abs(r["error_vs_artifact_pollux"]) <= 0.10 for r in goodput)
        if goodput
        else None,
        "machine": platform.platform(),
        "rows": sorted(rows, key=lambda r: (r["policy"], r["workload"])),
    }
    OUT.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
