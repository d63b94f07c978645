"""Issue 56's design step, sized: a same-host all-reduce through shared memory (each rank writes its
slot, posts a sequence number, spins with sched_yield until its peer's, sums) against gloo's, for
the 0.1 MB MLP's gradients (85,002 floats), inside the benchmark's own DDP-like loop: 2 spawned
ranks, one thread each, 5 interleaved rounds of 500 steps (first 50 untimed)."""
import os, socket, statistics, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def shm_allreduce(buf, slots, flags, rank, seq):
    par = seq % 2
    slots[par, rank].copy_(buf)
    flags[rank] = seq
    other = 1 - rank
    t0 = time.perf_counter()
    while int(flags[other]) < seq:
        os.sched_yield()
        if time.perf_counter() - t0 > 10:
            raise TimeoutError("peer")
    torch.add(slots[par, 0], slots[par, 1], out=buf)
    buf.div_(2)

def body(rank, port, rounds, slots, flags, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from distlab import data, zoo
    from distlab.runtime.data import RankBatches
    from distlab.runtime.trainer import default_loss
    model = zoo.get("mlp", seed=0, in_features=64, width=256, depth=2)
    params = [p for p in model.parameters()]
    n = sum(p.numel() for p in params)
    assert n == slots.shape[2], (n, slots.shape)
    ds = data.synthetic(model, n=64 * 2 * 500, seed=0)
    opt = torch.optim.SGD(params, lr=0.01)
    batches = RankBatches(ds, 64, rank, 2, True, 0)
    buf = torch.empty(n)
    res = {"gloo": [], "shm": []}
    seq = 0
    for r in range(rounds):
        for mode in (("gloo", "shm") if r % 2 == 0 else ("shm", "gloo")):
            dist.barrier()
            t0 = 0.0
            for step in range(500):
                if step == 50:
                    t0 = time.perf_counter()
                x, y = batches.get(step * 128)
                opt.zero_grad(set_to_none=True)
                default_loss(model(x), y).backward()
                torch.cat([p.grad.reshape(-1) for p in params], out=buf)
                if mode == "gloo":
                    dist.all_reduce(buf); buf.div_(2)
                else:
                    seq += 1
                    shm_allreduce(buf, slots, flags, rank, seq)
                off = 0
                for p in params:
                    p.grad.copy_(buf[off:off + p.numel()].view_as(p)); off += p.numel()
                opt.step()
            res[mode].append((time.perf_counter() - t0) / 450 * 1e3)
    w = torch.cat([p.detach().reshape(-1) for p in params])
    ws = [torch.empty_like(w) for _ in range(2)]
    dist.all_gather(ws, w)
    if rank == 0:
        res["replicas_equal"] = bool(torch.equal(ws[0], ws[1]))
        q.put(res)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    from distlab import zoo
    n = sum(p.numel() for p in zoo.get("mlp", seed=0, in_features=64, width=256, depth=2).parameters())
    slots = torch.zeros(2, 2, n).share_memory_()
    flags = torch.zeros(2, dtype=torch.int64).share_memory_()
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.get_context("spawn"); q = ctx.Manager().Queue()
    mp.spawn(body, args=(port, int(sys.argv[1]), slots, flags, q), nprocs=2)
    res = q.get()
    for k in ("gloo", "shm"):
        print(k, "ms a step per round", [round(x, 3) for x in res[k]], "median", round(statistics.median(res[k]), 3))
    print("gloo / shm step per round", [round(a / b, 2) for a, b in zip(res["gloo"], res["shm"])])
    print("replicas equal after both:", res["replicas_equal"])
