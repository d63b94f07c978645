import json, glob, statistics, collections
import os
HERE = os.path.dirname(os.path.abspath(__file__))
for path in sorted(glob.glob(os.path.join(HERE, "*.json"))):
    d = json.load(open(path)); s = d["summary"]
    rows = [r for r in d["rows"] if "program" in r]
    ps = [r for r in rows if r["program"] == "async_push_sum"]
    wmin = min(r["weight_min"] for r in ps if r.get("weight_min") is not None)
    wmax = max(r["weight_max"] for r in ps if r.get("weight_max") is not None)
    fl = statistics.median(r["final_loss"] for r in ps)
    fls = statistics.median(r["final_loss"] for r in rows if r["program"] == "sync_gossip")
    cd = statistics.median(r["consensus_distance"] for r in ps)
    print(os.path.basename(path)[:-5], "ps/sync ttt median %.3f max %.3f strict %.3f | mlp %.3f tab %.3f | p %.3f-%.2f | final loss ps %.4f sync %.4f | cd %.3f" % (
        s["async_push_sum_over_sync_gossip_time_to_target_median"], s["async_push_sum_over_sync_gossip_time_to_target_max"],
        s["async_push_sum_over_sync_gossip_strict_time_to_target_median"],
        s["mlp/async_push_sum_over_sync_gossip_time_to_target"], s["tabular/async_push_sum_over_sync_gossip_time_to_target"], wmin, wmax, fl, fls, cd))
