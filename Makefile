# Two entry points for a fresh machine: `make demo` (set up + run the whole workflow) and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.calibkit-installed

.PHONY: setup demo demo-fast test test-fast lint typecheck bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[demo,dev]'
	$(BIN)/python -m pip install -q --no-deps 'tensorrt-stubs==10.13.0.35.1'
	touch $@

demo: setup
	$(BIN)/calibkit demo run

demo-fast: setup
	$(BIN)/calibkit demo run --fast

# every core (pytest-xdist): one test file per worker at a time, so a module's fixtures are built once; the
# longest tests start first (tests/conftest.py). `pytest -n 0` or a plain `pytest` runs them in this process.
test: setup typecheck
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder

test-fast: setup
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder -m "not slow"

lint: setup
	$(BIN)/ruff check calibkit tests benchmarks

# mypy over calibkit/ ([tool.mypy] in pyproject.toml), then the TensorRT backend against tensorrt-stubs (patched
# copy: the published stubs have syntax errors)
typecheck: setup
	$(BIN)/python -m mypy
	$(BIN)/python tools/mypy_tensorrt.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
