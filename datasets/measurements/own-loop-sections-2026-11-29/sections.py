import sys, statistics, time
import dask
dask.config.set({"distributed.worker.daemon": False})
import torch
import torch.nn.functional as F
import distlab as dl
from distlab.bench import own_loop as ol
from distlab.bench import ddp as bd
from dataclasses import dataclass

KEYS = ("batch", "fwd", "loss", "zero", "bwd", "step", "report", "total")

@dataclass
class Timed(ol.PlainLoop):
    def __call__(self, ctx):
        from torch.utils.data import DataLoader
        opt = torch.optim.SGD(self.model.parameters(), lr=self.lr)
        loader = DataLoader(self.dataset, batch_size=self.batch, shuffle=True)
        model, opt, loader = ctx.prepare(self.model, opt, loader)
        acc = dict.fromkeys(KEYS, 0.0); n = 0
        it = iter(loader)
        while ctx.step < self.steps:
            t0 = time.perf_counter()
            x, y = next(it)
            t1 = time.perf_counter(); out = model(x)
            t2 = time.perf_counter(); loss = F.cross_entropy(out, y)
            t3 = time.perf_counter(); opt.zero_grad()
            t4 = time.perf_counter(); loss.backward()
            t5 = time.perf_counter(); opt.step()
            t6 = time.perf_counter(); ctx.report(loss=loss.item())
            t7 = time.perf_counter()
            if ctx.step > 50:
                for k, a, b in zip(KEYS, (t0, t1, t2, t3, t4, t5, t6, t0), (t1, t2, t3, t4, t5, t6, t7, t7)):
                    acc[k] += b - a
                n += 1
        out = {k: round(v / n * 1e3, 3) for k, v in acc.items()}
        import json; open(f"/tmp/ol/rank{ctx.rank}.json", "w").write(json.dumps(out))
        return out

def ddp_timed(rank, world, addr, port, opts, batch, steps):
    torch.set_num_threads(1)
    from torch.nn.parallel import DistributedDataParallel
    from distlab.runtime.data import RankBatches
    import torch.distributed as dist
    model, dataset = bd._model_and_data("mlp", opts, n=max(4096, batch * world * steps))
    store = dist.PrefixStore("t/", dist.TCPStore(addr, port, world, False))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    batches = RankBatches(dataset, batch, rank, world, True, 0)
    G = batch * world
    acc = dict.fromkeys(KEYS, 0.0); n = 0
    for step in range(steps):
        t0 = time.perf_counter(); x, y = batches.get(step * G)
        t1 = time.perf_counter(); out = ddp(x)
        t2 = time.perf_counter(); loss = F.cross_entropy(out, y)
        t3 = time.perf_counter(); opt.zero_grad(set_to_none=True)
        t4 = time.perf_counter(); loss.backward()
        t5 = time.perf_counter(); opt.step()
        t6 = time.perf_counter(); loss.item()
        t7 = time.perf_counter()
        if step > 50:
            for k, a, b in zip(KEYS, (t0, t1, t2, t3, t4, t5, t6, t0), (t1, t2, t3, t4, t5, t6, t7, t7)):
                acc[k] += b - a
            n += 1
    dist.destroy_process_group()
    return {k: round(v / n * 1e3, 3) for k, v in acc.items()}

if __name__ == "__main__":
    opts = {"in_features": 64, "width": 256, "depth": 2}
    batch, workers, steps = 64, 2, 1000
    lab = dl.Lab(workers=workers)
    model, dataset = ol.build_case(opts, batch, workers, steps)
    for i in range(int(sys.argv[1])):
        d = lab.run_ranks(ddp_timed, opts, batch, steps)
        run = lab.run(Timed(model, dataset, batch, steps), strategy="AllReduce"); run.wait(600, progress=False)
        import json
        print("ddp0", d[0]); print("ddp1", d[1]); print("own0", run.result); print("own1", json.load(open("/tmp/ol/rank1.json")), flush=True)
    lab.close()
