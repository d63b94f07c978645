# The commands of the README: `make demo`, `make test` (everything; what CI runs) and `make check`
# (the fast tests, for the inner loop). Everything else is set-up.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/pip install --disable-pip-version-check -q -c constraints.txt
# a GPU machine (nvidia-smi lists a device) also gets the gpu extra (dask-cuda's LocalCUDACluster)
comma := ,
GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
EXTRAS := dev,bench,slurm$(if $(GPU),$(comma)gpu)
# where torch comes from: the index pip is configured with, unless TORCH_INDEX names another
# (make test TORCH_INDEX=https://download.pytorch.org/whl/cpu for the CPU build from PyPI's mirror)
TORCH_INDEX ?=

.PHONY: demo test check install lint bench browser-deps clean slurm-up slurm-down

$(STAMP): pyproject.toml constraints.txt kernels/distlab/kernel.json kernels/distlab/logo-32x32.png kernels/distlab/logo-64x64.png
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) torch==2.13.0
	$(PIP) tensorflow-cpu==2.21.0
	$(PIP) -e ".[$(EXTRAS)]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
	$(BIN)/jupyter kernelspec install --sys-prefix kernels/distlab >/dev/null
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/distlab demo --out out

test: $(STAMP) browser-deps
	$(BIN)/python -m pytest -q --durations=30

# every module's fast tests: no notebooks, browsers, TensorFlow children, calibrations or clusters
# (what `slow` marks: tests/conftest.py says which)
check: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --durations=10

# Debian's Chromium for the real-browser test; skipped (and the test skips) where apt cannot install it.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: the browser test will skip"; }

lint: $(STAMP)
	$(BIN)/ruff check distlab tests
	$(BIN)/ruff format --check distlab tests
	$(BIN)/basedpyright --pythonpath $(BIN)/python

bench: $(STAMP)
	$(BIN)/distlab bench --list

# a one-node Slurm on this machine (root: Debian's slurm-wlm and munge, installed when missing) for
# tests/slurm and docs/multi-host.md; config, state and logs under .slurm/
slurm-up:
	bash scripts/slurm.sh up

slurm-down:
	bash scripts/slurm.sh down

clean:
	rm -rf $(VENV) out .pytest_cache
