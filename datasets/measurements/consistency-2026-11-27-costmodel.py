"""Score the cost-model path for stale PS: lab.calibrate() on 4 workers, then consistency.price for every configuration
of the consistency benchmark's run d, against its measured medians (the runs are in the JSON)."""
import json, sys
import numpy as np, pandas as pd, torch, torch.nn as nn
import distlab as dl
from distlab.costmodel import consistency as cons

class Tabular(nn.Module):
    def __init__(self, features=40, width=128, classes=6):
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(2))
        self.out = nn.Linear(width, classes)
    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks: h = h + b(h)
        return self.out(h)

if __name__ == "__main__":
    d = json.load(open(sys.argv[1]))
    df = pd.DataFrame([r for r in d["rows"] if r.get("kind") != "probe"])
    lab = dl.Lab(workers=4)
    torch.manual_seed(0)
    models = {"mlp": dl.zoo.get("mlp", width=256), "tabular": Tabular()}
    cm = lab.calibrate(models=list(models.values()))
    out = []
    for name, model in models.items():
        prof = dl.profile(model, batch_size=32)
        lab.measure_model(model, batch_size=32)
        cm = lab.cost_model
        for (cond, s), g in df[df.model == name].groupby(["condition", "staleness"]):
            opts = {"sync": False} if s == "async" else {"staleness": int(s)}
            st = dl.strategy.build("PSLoadBalancing", prof, lab.resources, servers="all", **opts)
            slow = g["slowdown"].iloc[0] or {}
            slow = {int(k): v for k, v in slow.items()}
            p = cons.price(cm, prof, lab.resources, st, slowdown=slow, jitter=float(g["jitter_knob"].median()))
            meas = float(g["measured_throughput"].median())
            out.append({"model": name, "condition": cond, "staleness": s, "predicted": p.throughput, "measured": meas,
                        "error": abs(p.throughput - meas) / meas})
            print(out[-1], flush=True)
    res = pd.DataFrame(out)
    print(res.round(3).to_string())
    print("median", res["error"].median(), "max", res["error"].max())
    json.dump({"rows": out, "summary": {"median": float(res["error"].median()), "max": float(res["error"].max())}},
              open(sys.argv[2], "w"), indent=1)
    lab.close()
