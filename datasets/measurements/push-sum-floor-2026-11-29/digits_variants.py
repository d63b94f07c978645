import sys, time, os
sys.path[:0] = ["/work/main/tests/runtime", "/work/main/tests"]
import numpy as np
from distlab.runtime.spawn import spawn_local

def body(rank, world, addr, port, cases, steps, variant):
    os.environ["DL_VARIANT"] = variant
    import torch
    from torch.utils.data import TensorDataset
    from sklearn.datasets import load_digits
    from runtime_bodies import strategy_for, job_for
    from distlab.runtime.trainer import run_rank
    X, y = load_digits(return_X_y=True)
    data = TensorDataset(torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y))
    out = {}
    for case in cases:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
        strategy = strategy_for(case, model, world)
        job = job_for(rank, world, addr, port, model, strategy, steps=steps, data=data,
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), batch_size=16,
            run_id=f"digits-{case}-{variant}", timeout=30.0)
        res = run_rank(job)
        out[case] = {"losses": np.array([r["loss"] for r in res["records"]]),
                     "weights": [r.get("weight") for r in res["records"]],
                     "distance": res["consensus_distance"]}
    return out

if __name__ == "__main__":
    n = int(sys.argv[1]); cases = sys.argv[2].split(","); variants = sys.argv[3].split(",")
    for i in range(n):
        for v in variants:
            res = spawn_local(4, body, cases, 60, v, timeout=300, threads=1)
            for c in cases:
                first = sum(res[r][c]["losses"][:5].mean() for r in range(4)) / 4
                last = sum(res[r][c]["losses"][-15:].mean() for r in range(4)) / 4
                per = [round(float(res[r][c]["losses"][-15:].mean()), 2) for r in range(4)]
                ws = [w for r in range(4) for w in res[r][c]["weights"] if w is not None]
                wr = f"p {min(ws):.3f}-{max(ws):.2f}" if ws else ""
                print(f"{i} {v} {c}: ratio {last/first:.3f} per-rank {per} dist {res[0][c]['distance']:.3g} {wr}", flush=True)
