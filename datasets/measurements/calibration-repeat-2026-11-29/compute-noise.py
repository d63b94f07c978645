import time, torch, statistics, sys
torch.set_num_threads(1)
a = torch.randn(256, 256)
def window(sec=0.4):
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < sec:
        a @ a; n += 1
    return (time.perf_counter() - t0) / n
ws = [window() for _ in range(30)]
med = statistics.median(ws)
print(sys.argv[1], "per-op ms median %.3f" % (med * 1e3), "min/max vs median %.1f%% %.1f%%" % ((min(ws)/med-1)*100, (max(ws)/med-1)*100),
      "spread of triples (median):", "%.1f%%" % (100*statistics.median([(max(ws[i:i+3])-min(ws[i:i+3]))/statistics.median(ws[i:i+3]) for i in range(0,30,3)])))
