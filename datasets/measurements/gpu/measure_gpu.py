"""The GPU figures of issue 44, measured on a lent device in one short run (see README.md beside this).

    python datasets/measurements/gpu/measure_gpu.py OUT_DIR [section,section,...]

Sections (each isolated: a failure is recorded and the next one runs; the JSON is rewritten after
each, so a run cut short keeps what it measured):
- ``env``: torch, CUDA, NCCL and the device;
- ``profile``: ``dl.profile`` of the zoo MLP and transformer on the GPU against a plain timed CUDA
  loop of the same step (forward, cross-entropy, backward; synchronised, median of 50);
- ``paths``: notebooks/bench/prediction-paths.ipynb on a two-worker GPU Lab (``Lab(2, gpus=True)``:
  two ranks share the one GPU over gloo; its "1 process" rows are world 1: a Lab of one worker
  cannot calibrate), fresh calibration;
- ``adaptive``: notebooks/bench/adaptive-batch.ipynb, the digits task, one GPU.

The device has no Jupyter kernel, so the notebooks run in this process: their code cells in
order, the given parameters set after the parameters cell (papermill's injection, without a kernel).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def env() -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "cpus": os.cpu_count(),
    }


def _timed_loop(model, x, y, steps: int = 50) -> float:
    import torch

    loss_fn = torch.nn.functional.cross_entropy
    times = []
    for i in range(steps + 5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(x)
        loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        for p in model.parameters():
            p.grad = None
        torch.cuda.synchronize()
        if i >= 5:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profile() -> dict:
    import torch

    import distlab as dl

    out = {}
    for name, bs in (("mlp", 64), ("transformer_lm", 16)):
        model = dl.zoo.get(name).cuda()
        data = dl.data.synthetic(name, n=4 * bs)
        x, y = data.inputs[:bs].cuda(), data.targets[:bs].cuda()
        t0 = time.perf_counter()
        prof = dl.profile(model, sample_input=x, batch_size=bs)
        wall = time.perf_counter() - t0
        loop = _timed_loop(model, x, y)
        torch.cuda.synchronize()
        out[name] = {
            "batch": bs,
            "profile_step": prof.step_time,
            "loop_step": loop,
            "ratio": prof.step_time / loop,
            "profile_wall_s": wall,
            "layers": len(prof.layers),
            "layer_time_sum": sum(lay.time_fwd + lay.time_bwd for lay in prof.layers),
            "method": prof.meta.get("step_time_method"),
            "tflops_per_s": prof.flops / loop / 1e12,
        }
    return out


def run_notebook(path: Path, params: dict) -> dict:
    """A notebook's code cells in order in one namespace, ``params`` set after the parameters cell."""
    nb = json.loads(path.read_text())
    ns: dict = {"__name__": "__nb__"}
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        exec(compile("".join(cell["source"]), str(path), "exec"), ns)  # noqa: S102 - our own notebook
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            ns.update(params)
    return json.loads(Path(params["result_path"]).read_text())["summary"]


def paths(workers: int, out: Path) -> dict:
    return run_notebook(
        ROOT / "notebooks/bench/prediction-paths.ipynb",
        dict(
            gpus=True,
            workers=workers,
            model_set="diagnostic",  # held out when this ran (2026-11-26); diagnostic since
            models="lstm_tagger,conv1d_bn",
            builders="AllReduce,PS" if workers > 1 else "AllReduce",
            steps=40,
            rounds=2,
            samples=1024,
            result_path=str(out / f"prediction-paths-gpu-w{workers}.json"),
        ),
    )


def adaptive(out: Path) -> dict:
    return run_notebook(
        ROOT / "notebooks/bench/adaptive-batch.ipynb",
        dict(
            gpus=True,
            workers=None,
            tasks=["digits"],
            sweep=[16, 256],
            steps={"quadratic": 600, "digits": 600},
            rounds=1,
            result_path=str(out / "adaptive-batch-gpu.json"),
        ),
    )


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    sections = {
        "env": env,
        "profile": profile,
        "paths": lambda: paths(2, out),
        "adaptive": lambda: adaptive(out),
    }
    chosen = sys.argv[2].split(",") if len(sys.argv) > 2 else list(sections)
    results: dict = {}
    for name in chosen:
        t0 = time.perf_counter()
        try:
            results[name] = sections[name]()
        except BaseException:  # noqa: BLE001 - recorded; the next section still runs
            results[name] = {"error": traceback.format_exc()[-4000:]}
        results[name]["wall_s"] = round(time.perf_counter() - t0, 1)
        (out / "gpu-figures.json").write_text(json.dumps(results, indent=1, default=str))
        print(f"== {name}: {json.dumps(results[name], default=str)[:2500]}", flush=True)


if __name__ == "__main__":
    main()
