import os, time, statistics, torch, torch.distributed as dist, torch.multiprocessing as mp
def run(rank, port):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = []
    for rep in range(6):
        row = []
        for nbytes in (4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20):
            x = torch.ones(nbytes // 4)
            ts = []
            for i in range(6):
                dist.barrier(); t0 = time.perf_counter(); dist.all_reduce(x); ts.append(time.perf_counter() - t0)
            t = torch.tensor(ts[1:], dtype=torch.float64); dist.all_reduce(t, op=dist.ReduceOp.MAX)
            row.append(statistics.median(t.tolist()) * 1e3)
        if rank == 0:
            print(" ".join(f"{v:6.2f}" for v in row), flush=True)
        time.sleep(0.3)
    dist.destroy_process_group()
if __name__ == "__main__":
    import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(run, args=(port,), nprocs=2)
