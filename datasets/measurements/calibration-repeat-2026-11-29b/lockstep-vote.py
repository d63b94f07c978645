"""Issue 57, the local-step stage: what the lockstep vote (a 4-byte all-reduce after each local step
at world 2) adds to a small reference model's step. Two spawned gloo ranks, one thread each, the
calibration's smallest reference MLP (1 layer, width 64, batch 8) and a wider one (12 layers);
per round, 60 local steps with the vote (as the calibration times them) and 60 without, the
order alternated, six rounds; each round's median and mean step (rank 0)."""
import socket, statistics, sys, time
import torch, torch.distributed as dist, torch.multiprocessing as mp

def body(rank, port, rounds, q):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    from distlab import data, zoo
    from distlab.runtime.loopbench import _time_local
    out = {}
    for layers in (1, 12):
        model = zoo.get("mlp", seed=0, in_features=64, width=64, depth=layers)
        ds = data.synthetic(model, n=4096, seed=0)
        res = {"vote": [], "free": []}
        for r in range(rounds):
            for mode in (("vote", "free") if r % 2 == 0 else ("free", "vote")):
                dist.barrier()
                ts = _time_local(model, ds, 8, rank, 2, 60, dist.group.WORLD if mode == "vote" else None)
                res[mode].append((statistics.median(ts) * 1e3, statistics.mean(ts) * 1e3))
        out[layers] = res
    if rank == 0:
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    ctx = mp.get_context("spawn"); q = ctx.Manager().Queue()
    mp.spawn(body, args=(port, int(sys.argv[1]), q), nprocs=2)
    out = q.get()
    for layers, res in out.items():
        for mode, v in res.items():
            print(f"{layers:2d} layers {mode}: median ms per round {[round(a, 3) for a, _ in v]}; mean {[round(b, 3) for _, b in v]}")
