import sys, json, time
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import dask
dask.config.set({"distributed.worker.daemon": False})
import torch
import torch.nn.functional as F
import distlab as dl
from distlab.bench import own_loop as ol
from sections import Timed, ddp_timed, KEYS
from dataclasses import dataclass

@dataclass
class Variant(Timed):
    variant: str = ""
    def __call__(self, ctx):
        s = getattr(ctx, "_s", None)
        if s is None:
            return super().__call__(ctx)
        orig = s.prepare
        def prepare(*a, **k):
            out = orig(*a, **k)
            if "nohooks" in self.variant:
                s.hooks.close()
            if "nograd" in self.variant:
                for h in s._grad_hooks: h.remove()
                for h in s.sync._hooks: h.remove()
            return out
        s.prepare = prepare
        acc = {}
        def timed(obj, name, key):
            f = getattr(obj, name)
            def g(*a, **k):
                t = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    acc[key] = acc.get(key, 0.0) + time.perf_counter() - t
            setattr(obj, name, g)
        orig2 = s.prepare
        def prepare2(*a, **k):
            out = orig2(*a, **k)
            if "noread" in self.variant:
                s.stop.period = 10**9
            if "syncread" in self.variant:
                st = s.stop
                def sync_read():
                    st.target = st._read()
                st._read_beside = sync_read
            timed(s.stop, "stop_before", "stop")
            timed(s, "_flush", "flush")
            timed(s.ckpts, "after_step", "ckpt")
            timed(s, "_new_step", "new_step")
            timed(s, "_boundary", "boundary")
            timed(s, "apply_step", "apply")
            timed(s.sync, "apply", "sync_apply")
            timed(s.hooks, "record", "hooks_record")
            timed(s.batches, "after_step", "batches_after")
            return out
        s.prepare = prepare2
        out = super().__call__(ctx)
        out.update({k: round(v / self.steps * 1e3, 4) for k, v in acc.items()})
        out["threads"] = torch.get_num_threads()
        out["interop"] = torch.get_num_interop_threads()
        return out

if __name__ == "__main__":
    opts = {"in_features": 64, "width": 256, "depth": 2}
    batch, workers, steps = 64, 2, 1000
    lab = dl.Lab(workers=workers)
    model, dataset = ol.build_case(opts, batch, workers, steps)
    for i in range(int(sys.argv[1])):
        d = lab.run_ranks(ddp_timed, opts, batch, steps)
        print("ddp", {k: d[0][k] for k in ("batch", "bwd", "total")}, flush=True)
        for v in (("plain", "syncread") if i % 2 == 0 else ("syncread", "plain")):
            run = lab.run(Variant(model, dataset, batch, steps, variant=v), strategy="AllReduce"); run.wait(600, progress=False)
            print(v, {k: run.result[k] for k in ("batch", "bwd", "total", "stop")}, flush=True)
    lab.close()
