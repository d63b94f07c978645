#!/bin/bash
# Issue 44's device run (one GPU, no network): the device tool runs it from the repository root
# with the wheels in .whl carried (README.md beside this says which) and $OUT set.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TQDM_DISABLE=1
nvidia-smi -L
python3 -c "import torch, dask, distributed, dask_cuda; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'dask', dask.__version__, 'dask-cuda', dask_cuda.__version__)"
timeout "${PYTEST_S:-170}" python3 -m pytest -m gpu -p no:cacheprovider -q -rA \
  ${TESTS:-tests/runtime/test_runtime_cuda.py tests/runtime/test_runtime_nccl.py tests/launch/test_lab_gpu.py} \
  >"$OUT/pytest-gpu.log" 2>&1
echo "pytest rc=$?"; grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" "$OUT/pytest-gpu.log" | tail -20
timeout "${MEASURE_S:-280}" python3 datasets/measurements/gpu/measure_gpu.py "$OUT" "${SECTIONS:-env,profile,paths,adaptive}" 2>&1 | grep -v "^\s*$" | tail -40
