# The two commands of the README:  `make demo`  and  `make test` (`make test-fast`: without the
# tests marked slow, under 2 minutes on 2 cores).
# Both create .venv, install the pinned CPU torch wheel first (a bare `torch` requirement would pull
# a multi-GB CUDA build), then the project with its dev extras.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0

.PHONY: setup demo test test-fast lint bench bench-gpu clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/otb-diag rollouts inspect
	$(BIN)/otb-diag energy --out out/energy
	$(BIN)/otb-diag variance-compare --out out/variance
	$(BIN)/otb-diag train --out out/train --quiet
	$(BIN)/otb-diag dynamics --log out/train/metrics.jsonl --out out/dynamics
	$(BIN)/otb-diag report out/energy out/variance out/dynamics --out out/report.html

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/python bench/bench_stats.py
	$(BIN)/python bench/bench_variance.py

# Every row of issue 25's table on one GPU (bench/gpu.py), then the CUDA-against-CPU tests. Run
# by the Python that has a CUDA torch (not `setup`'s venv, which pins the CPU wheel).
bench-gpu:
	cd bench && $(PYTHON) gpu.py
	$(PYTHON) -m pytest -q -m gpu tests/gpu

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
