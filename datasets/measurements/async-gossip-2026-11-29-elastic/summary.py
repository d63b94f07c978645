"""Prints each run's push-sum ÷ synchronous gossip time to target (median of its 10 model-rounds),
the strict figure, and each program's median wall time (s)."""
import glob
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for path in sorted(glob.glob(os.path.join(HERE, sys.argv[1] if len(sys.argv) > 1 else "*", "*.json"))):
    d = json.load(open(path))
    s = d["summary"]
    rows = [r for r in d["rows"] if "program" in r]
    w = {p: statistics.median(r["wall"] for r in rows if r["program"] == p) for p in ("sync_gossip", "async_push_sum")}
    print(
        os.path.relpath(path, HERE),
        "ps/sync ttt %.3f strict %.3f" % (
            s["async_push_sum_over_sync_gossip_time_to_target_median"],
            s["async_push_sum_over_sync_gossip_strict_time_to_target_median"],
        ),
        "wall", {k: round(v, 2) for k, v in w.items()},
    )
