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
    from distlab.sched import artifact

    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workloads", type=int, nargs="*", default=list(range(1, 9)))
    parser.add_argument("--policies", nargs="*", default=["goodput", "fifo"])
    opts = parser.parse_args()
    tasks = [(n, p) for p in opts.policies for n in opts.workloads]
    with multiprocessing.Pool(opts.workers) as pool:
        rows = pool.map(run, tasks, chunksize=1)
    ref = artifact.reference()
    for row in rows:
        key = f"workload-{row['workload']}"
        row["artifact_pollux_avg_jct"] = ref["pollux"]["avgs"][key]
        row["artifact_tiresias_avg_jct"] = ref["tiresias"]["avgs"][key]
        row["artifact_optimus_avg_jct"] = ref["optimus"]["avgs"][key]
        if row["policy"] == "goodput":
            row["error_vs_artifact_pollux"] = row["avg_jct"] / ref["pollux"]["avgs"][key] - 1
    goodput = [r for r in rows if r["policy"] == "goodput"]
    mean = sum(r["avg_jct"] for r in goodput) / max(len(goodput), 1)
    ref_mean = sum(ref["pollux"]["avgs"][f"workload-{r['workload']}"] for r in goodput) / max(len(goodput), 1)
    summary = {
        "what": "distlab.sched.artifact.replay(n, policy) on the Pollux artifact's workloads (1.0x load), "
        "16 hosts x 4 GPUs, 60 s interval, 30 s restart",
        "target": "goodput policy's average JCT within 10% of the artifact's Pollux result, per workload",
        "goodput_mean_avg_jct": mean,
        "artifact_pollux_mean_avg_jct": ref_mean,
        "mean_error": mean / ref_mean - 1 if goodput else None,
        "max_abs_error": max((abs(r["error_vs_artifact_pollux"]) for r in goodput), default=None),
        "met": all(abs(r["error_vs_artifact_pollux"]) <= 0.10 for r in goodput),
        "machine": platform.platform(),
        "rows": sorted(rows, key=lambda r: (r["policy"], r["workload"])),
    }
    OUT.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
