# The two commands of the README: `make demo` and `make test`. Everything else is set-up.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/pip install --disable-pip-version-check -q -c constraints.txt

.PHONY: demo test install lint bench browser-deps clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3" >/dev/null
	$(BIN)/jupyter kernelspec install --sys-prefix kernels/distlab >/dev/null
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	mkdir -p out
	$(BIN)/distlab demo --out out

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check distlab tests

bench: $(STAMP)
	$(BIN)/distlab bench --list

clean:
	rm -rf $(VENV) out .pytest_cache
