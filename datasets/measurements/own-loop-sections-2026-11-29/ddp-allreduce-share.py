"""Issue 56: where plain DDP's 0.1 MB step goes on this machine: the same loop with its all-reduce
(DDP as the benchmark runs it) and without (no_sync: the gradients stay local), 2 spawned ranks,
gloo, one thread each, 5 interleaved rounds of 500 steps (first 50 untimed)."""
import contextlib, socket, statistics, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def body(rank, port, rounds, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from torch.nn.parallel import DistributedDataParallel
    from distlab import data, zoo
    from distlab.runtime.data import RankBatches
    from distlab.runtime.trainer import default_loss
    model = zoo.get("mlp", seed=0, in_features=64, width=256, depth=2)
    ds = data.synthetic(model, n=64 * 2 * 500, seed=0)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    batches = RankBatches(ds, 64, rank, 2, True, 0)
    res = {"ddp": [], "no_allreduce": []}
    for r in range(rounds):
        for mode in (("ddp", "no_allreduce") if r % 2 == 0 else ("no_allreduce", "ddp")):
            dist.barrier()
            t0 = 0.0
            for step in range(500):
                if step == 50:
                    t0 = time.perf_counter()
                x, y = batches.get(step * 128)
                opt.zero_grad(set_to_none=True)
                with (ddp.no_sync() if mode == "no_allreduce" else contextlib.nullcontext()):
                    default_loss(ddp(x), y).backward()
                opt.step()
            res[mode].append((time.perf_counter() - t0) / 450 * 1e3)
    if rank == 0:
        q.put(res)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.get_context("spawn"); q = ctx.Manager().Queue()
    mp.spawn(body, args=(port, int(sys.argv[1]), q), nprocs=2)
    res = q.get()
    for k, v in res.items():
        print(k, "ms a step per round", [round(x, 3) for x in v], "median", round(statistics.median(v), 3))
    share = [1 - b / a for a, b in zip(res["ddp"], res["no_allreduce"])]
    print("all-reduce's share of DDP's step per round", [round(x, 3) for x in share], "median", round(statistics.median(share), 3))
