"""Score the cost-model path for gossip under a straggler: lab.calibrate() on 4 workers and each model's own step,
then gossip_pricing.price (all-reduce: consistency.simulate on its prediction) for every program of the async-gossip
benchmark's run, against its measured medians (the runs are in the JSON given)."""
import json, sys
import pandas as pd, torch, torch.nn as nn
import distlab as dl
from distlab.costmodel import consistency as cons, gossip_pricing as gp

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

BUILD = {"allreduce": ("AllReduce", {}), "sync_gossip": ("Gossip", {"topology": "exp2"}),
         "async_push_sum": ("Gossip", {"topology": "exp2", "asynchronous": True}),
         "async_average": ("Gossip", {"topology": "exp2", "asynchronous": True, "mode": "average"})}

if __name__ == "__main__":
    d = json.load(open(sys.argv[1]))
    df = pd.DataFrame([r for r in d["rows"] if r.get("kind") != "put"])
    batch, slow = 512, {3: float(d["summary"]["slow_factor"])}
    lab = dl.Lab(workers=4)
    torch.manual_seed(0)
    models = {"mlp": dl.zoo.get("mlp", width=256), "tabular": Tabular()}
    lab.calibrate(models=list(models.values()))
    out = []
    for name, model in models.items():
        prof = dl.profile(model, batch_size=batch)
        lab.measure_model(model, batch_size=batch)
        cm = lab.cost_model
        for program, g in df[df.model == name].groupby("program"):
            builder, opts = BUILD[program]
            st = dl.strategy.build(builder, prof, lab.resources, **opts)
            if builder == "Gossip":
                p = gp.price(cm, prof, lab.resources, st, slowdown=slow)
                thr = p.throughput
            else:
                base = cm.predict(prof, lab.resources, st)
                b = base.breakdown
                ranks = [cons.RankTime(b["compute"], cons.DEFAULT_NOISE, b["optimizer"])] * st.world
                thr = cons.simulate(ranks, 0, b["comm"] / 2, b["comm"] / 2, batch, slow).throughput
            meas = float(g["measured_throughput"].median())
            out.append({"model": name, "program": program, "predicted": thr, "measured": meas,
                        "error": abs(thr - meas) / meas})
            print(out[-1], flush=True)
    res = pd.DataFrame(out)
    print(res.round(3).to_string())
    print("median", res["error"].median(), "max", res["error"].max())
    json.dump({"rows": out, "summary": {"median": float(res["error"].median()), "max": float(res["error"].max())}},
              open(sys.argv[2], "w"), indent=1)
    lab.close()
