# gpupool: `make run` starts a pool on this machine, `make test` runs every check.
#
#   make run                      # the pool at http://127.0.0.1:8470/ (dashboard and API)
#   make run PORT=9000            # another port (or: GPUPOOL_PORT=9000 make run)
#   make run SIMULATE=2xA100-80GB,2xT4
#   make test                     # lint, types, import layers, the test suite
#   make pytest PYTEST_WORKERS=2  # the suite alone, on 2 xdist workers (default 4)
#
# `run` installs only what the pool needs (`pip install -e .`); the dev tools (ruff, mypy,
# pytest, playwright, ...) come with the first target that needs them (`test`, `lint`, ...).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
PORT ?=
SIMULATE ?=
PYTEST_WORKERS ?= 4

.PHONY: run test lint format typecheck pytest clean

# The runtime install: (re)done when the venv is missing or pyproject.toml changed.
$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	@touch $(RUN_STAMP)

# The dev install (runtime and dev tools); it covers the runtime one too.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/gpupool up $(if $(PORT),--port $(PORT)) $(if $(SIMULATE),--simulate $(SIMULATE))

lint: $(STAMP)
	$(BIN)/ruff check src tests $(wildcard benchmarks)
	$(BIN)/ruff format --check src tests $(wildcard benchmarks)
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite on PYTEST_WORKERS pytest-xdist workers (tests/conftest.py says which tests share
# one); most tests wait on real processes, so more workers than cores pays. Then the tests
# marked `serial` (they measure a share of CPU or time: the shim's pacing) alone.
pytest: $(STAMP)
	@a=0; $(BIN)/pytest -n $(PYTEST_WORKERS) -m "not serial" || a=$$?; \
	$(BIN)/pytest -m serial -q || exit $$?; exit $$a

test: lint typecheck pytest

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
