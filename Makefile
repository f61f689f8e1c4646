# The two commands of the README:  `make demo`  and  `make test` (everything; `make test-fast`:
# the inner loop, without the tests marked slow, torchrun or external; see docs/ci.md for times).
# Both create .venv, install the pinned CPU torch wheel first (a bare `torch` requirement would pull
# a multi-GB CUDA build), then the project with its dev extras.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0
# pytest-xdist workers for `make test` / `make test-fast` (CI has 2 cores; each worker runs torch
# on one thread, tests/conftest.py). JOBS=0 runs the suite in this one process, at torch's
# default threads.
JOBS   ?= 2

.PHONY: setup setup-sharded setup-verl demo test test-fast lint bench bench-gpu clean

# pip byte-compiles every module it installs on one core (40 of a fresh set-up's 70 s here):
# --no-compile, then compileall on every core. Not left to Python's lazy compiling: where
# PYTHONDONTWRITEBYTECODE is set (as on our development machines), every process would compile
# torch again.

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile "$(TORCH)"
	$(BIN)/python -m pip install --quiet --no-compile -e ".[dev]"
	@# "|| true": a few modules are not this Python's code (torch's py312 test helper); pip skips them too
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true
	touch $@

# The [sharded] extra for the tests' DeepSpeed ZeRO-3 runs (tests/integrations/test_trl_sharded.py,
# skipped without it): `make test` and `make test-fast` take it, `make demo` does not (its set-up
# stays as it was). DS_BUILD_OPS=0: DeepSpeed compiles none of its C++/CUDA ops at install time.
setup-sharded: $(VENV)/.sharded

$(VENV)/.sharded: $(VENV)/.installed
	DS_BUILD_OPS=0 $(BIN)/python -m pip install --quiet --no-compile -e ".[dev,sharded]"
	$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" >/dev/null || true
	touch $@

# Optional, not part of `setup`: verl 0.9.1's own objects for the tests marked `verl` (skipped
# without it). --no-deps: verl's full requirements pull vLLM-era pins (transformers < 5.11,
# wandb, hydra ...) that the tests do not need; these are what `import verl.protocol`,
# `core_algos`, `metric_utils` and the FSDP engine module need on a CPU machine. pyvers without
# its deps keeps packaging 26 (pyvers 0.1 pins packaging < 26; tensordict 0.10 needs pyvers < 0.2).
setup-verl: setup
	$(BIN)/python -m pip install --quiet --no-deps verl==0.9.1 tensordict==0.10.0 "pyvers<0.2" peft
	$(BIN)/python -m pip install --quiet ray omegaconf codetiming cloudpickle orjson importlib_metadata

demo: setup
	$(BIN)/otb-diag rollouts inspect
	$(BIN)/otb-diag energy --out out/energy
	$(BIN)/otb-diag variance-compare --out out/variance
	$(BIN)/otb-diag train --out out/train --quiet
	$(BIN)/otb-diag dynamics --log out/train/metrics.jsonl --out out/dynamics
	$(BIN)/otb-diag report out/energy out/variance out/dynamics --out out/report.html

test: setup-sharded
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(JOBS)

test-fast: setup-sharded
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(JOBS) -m "not slow and not torchrun and not external"

bench: setup
	$(BIN)/python bench/bench_stats.py
	$(BIN)/python bench/bench_variance.py

# Every row of bench/gpu.py on one GPU, each in its own process under a time limit (8 minutes in
# all), then the CUDA-against-CPU tests (under 150 s), whatever the rows gave: a short GPU loan's
# check (issue 48). Run by the Python that has a CUDA torch (not `setup`'s venv, which pins the
# CPU wheel). Exits non-zero if a row or a test failed.
bench-gpu:
	cd bench && $(PYTHON) gpu.py; rows=$$?; cd .. && timeout 150 $(PYTHON) -m pytest -q -m gpu tests/gpu; tests=$$?; exit $$((rows || tests))

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
