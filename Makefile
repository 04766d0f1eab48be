# The two commands: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint typecheck unit bench bench-api clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever the project's metadata changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/xr demo

test: $(STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -m "not slow" -q

test-slow: $(STAMP)
	$(BIN)/pytest -m slow -q

bench: $(STAMP)
	$(BIN)/python bench/core_apply.py
	$(BIN)/python bench/raftstore.py

# The HTTP API against a 3-member etcd 3.4 cluster, interleaved (installs etcd-server if missing).
bench-api: $(STAMP)
	$(BIN)/python bench/api.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
