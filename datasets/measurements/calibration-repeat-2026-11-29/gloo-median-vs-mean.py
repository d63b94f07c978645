import time, statistics, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    res = {64 << 10: ([], []), 2 << 20: ([], [])}
    for rep in range(8):
        for nbytes in res:
            x = torch.ones(nbytes // 4)
            ts = []
            for i in range(21):
                dist.barrier(); t0 = time.perf_counter(); dist.all_reduce(x); ts.append(time.perf_counter() - t0)
            t = torch.tensor(ts[1:], dtype=torch.float64); dist.all_reduce(t, op=dist.ReduceOp.MAX)
            res[nbytes][0].append(statistics.median(t.tolist()) * 1e3); res[nbytes][1].append(statistics.mean(t.tolist()) * 1e3)
        time.sleep(0.3)
    if rank == 0:
        for n, (med, mean) in res.items():
            sp = lambda v: (max(v) - min(v)) / statistics.median(v)
            print(f"{n >> 10} KiB medians {[round(v, 2) for v in med]} spread {sp(med):.0%}; means {[round(v, 2) for v in mean]} spread {sp(mean):.0%}")
    dist.destroy_process_group()
if __name__ == "__main__":
    import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(port,), nprocs=2)
