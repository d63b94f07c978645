import time, statistics, torch
torch.set_num_threads(1)
p = torch.nn.Parameter(torch.zeros(1 << 21)); p.grad = torch.ones(1 << 21)
sgd = torch.optim.SGD([p], lr=0.01).step
evict = torch.zeros(1 << 24)
def cold(): evict.add_(1.0)
for name, fn in (("sgd", sgd),):
    meds, means, med15 = [], [], []
    for r in range(10):
        ts = []
        for i in range(15):
            cold(); t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        meds.append(statistics.median(ts[:5]) * 1e3); means.append(statistics.mean(ts) * 1e3); med15.append(statistics.median(ts) * 1e3)
        time.sleep(0.5)
    sp = lambda v: (max(v) - min(v)) / statistics.median(v)
    print(name, "median of 5:", [round(v, 2) for v in meds], f"spread {sp(meds):.0%}")
    print(name, "median of 15:", [round(v, 2) for v in med15], f"spread {sp(med15):.0%}")
    print(name, "mean of 15:", [round(v, 2) for v in means], f"spread {sp(means):.0%}")
