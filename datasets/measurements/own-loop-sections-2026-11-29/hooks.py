import time, torch, statistics
import torch.nn.functional as F
torch.set_num_threads(1)
from distlab import zoo
m = zoo.get("mlp", seed=0, in_features=64, width=256, depth=2)
x = torch.randn(64, 64); y = torch.randint(0, 10, (64,))
out_features = m(x).shape
y = torch.randint(0, m(x).shape[1], (64,))
def bench(n=2000):
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n // 5):
            loss = F.cross_entropy(m(x), y); loss.backward(); m.zero_grad(set_to_none=True)
        ts.append((time.perf_counter() - t) / (n // 5) * 1e6)
    return round(min(ts), 1)
base = bench()
print("base us", base)
hs = [p.register_post_accumulate_grad_hook(lambda p: None) for p in m.parameters()]
print("+post_accumulate hooks", bench() - base); [h.remove() for h in hs]
hs = [p.register_hook(lambda g: None) for p in m.parameters()]
print("+tensor hooks", bench() - base); [h.remove() for h in hs]
hs = [m.register_forward_pre_hook(lambda mod, a: None), m.register_forward_hook(lambda mod, a, o: None)]
print("+fwd hooks", bench() - base); [h.remove() for h in hs]
eng = torch._C._ImperativeEngine
def fh(mod, a, o):
    o.grad_fn.register_prehook(lambda *g: torch.autograd.Variable._execution_engine.queue_callback(lambda: None))
hs = [m.register_forward_hook(fh)]
print("+grad_fn prehook + callback", bench() - base); [h.remove() for h in hs]
print("base again", bench())
