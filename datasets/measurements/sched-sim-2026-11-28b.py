"""Replay the Pollux artifact's workloads with distlab's step model as each job's throughput model.

Beside sched-sim-2026-11-28.json (the goodput policy with Pollux's own model, and FIFO, which this
script reads and does not re-run: the replay is deterministic): the same goodput policy whose jobs
are ``artifact_distlab.DistlabJob``. The artifact measured one strategy per model, so there is no
strategy to re-choose here; the card (sched-sim-2026-11-28b.md) says what this does and does not test.
Usage: python datasets/measurements/sched-sim-2026-11-28b.py [--workers 2] [--workloads 6 1 ...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import time
from pathlib import Path

OUT = Path(__file__).with_suffix(".json")
FIRST = Path(__file__).with_name("sched-sim-2026-11-28.json")


def run(number: int) -> dict:
    from distlab.sched import artifact
    from distlab.sched.artifact_distlab import DistlabJob

    start = time.perf_counter()
    result = artifact.replay(number, "goodput", job=DistlabJob)
    return {
        "workload": number,
        "policy": "goodput, distlab's step model",
        **result.summary(),
        "restarts": int(result.jobs.restarts.sum()),
        "refused": result.refused,
        "wall_s": round(time.perf_counter() - start, 1),
    }


def write(rows: list[dict], planned: list[int]) -> None:
    from distlab.sched import artifact

    ref = artifact.reference()
    first = {(r["policy"], r["workload"]): r for r in json.loads(FIRST.read_text())["rows"]}
    out = []
    for row in sorted(rows, key=lambda r: r["workload"]):
        key = f"workload-{row['workload']}"
        pollux_model = first[("goodput", row["workload"])]
        fifo = first[("fifo", row["workload"])]
        out.append(
            {
                **row,
                "artifact_pollux_avg_jct": ref["pollux"]["avgs"][key],
                "artifact_pollux_p99_jct": ref["pollux"]["p99"][key],
                "goodput_pollux_model_avg_jct": pollux_model["avg_jct"],
                "goodput_pollux_model_p99_jct": pollux_model["p99_jct"],
                "fifo_avg_jct": fifo["avg_jct"],
                "vs_artifact_pollux": row["avg_jct"] / ref["pollux"]["avgs"][key] - 1,
                "vs_goodput_pollux_model": row["avg_jct"] / pollux_model["avg_jct"] - 1,
            }
        )
    n = max(len(out), 1)
    summary = {
        "what": "artifact.replay(n, 'goodput', job=DistlabJob): the goodput policy with each job's "
        "throughput from distlab's step model fitted to its own steps; 16 hosts x 4 GPUs, 60 s "
        "interval, the artifact's 30 s restart",
        "planned": planned,
        "finished": len(out),
        "mean_avg_jct": sum(r["avg_jct"] for r in out) / n,
        "mean_goodput_pollux_model_avg_jct": sum(r["goodput_pollux_model_avg_jct"] for r in out) / n,
        "mean_artifact_pollux_avg_jct": sum(r["artifact_pollux_avg_jct"] for r in out) / n,
        "machine": platform.platform(),
        "rows": out,
    }
    OUT.write_text(json.dumps(summary, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workloads", type=int, nargs="*", default=[6, 1, 3, 2, 4, 5, 7, 8])
    opts = parser.parse_args()
    rows: list[dict] = []
    with multiprocessing.Pool(opts.workers) as pool:
        for row in pool.imap_unordered(run, opts.workloads, chunksize=1):
            rows.append(row)
            write(rows, opts.workloads)  # after every workload, so a run cut short keeps what finished
            print(row, flush=True)


if __name__ == "__main__":
    main()
