# The two commands: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow lint typecheck unit bench bench-api ui-deps jepsen jepsen-deps docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstall whenever the project's metadata changes.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# On a machine with an NVIDIA GPU the demo's jobs run on it through CuPy (the `gpu` extra).
demo: $(STAMP)
	@if command -v nvidia-smi >/dev/null 2>&1 && ! $(BIN)/python -c "import cupy" 2>/dev/null; then \
	  echo "GPU found: installing CuPy (the gpu extra)"; \
	  $(BIN)/python -m pip install --quiet -e '.[test,gpu]'; fi
	$(BIN)/xr demo

test: $(STAMP) ui-deps jepsen-deps lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The dashboard's browser test drives Debian's chromium (installed when missing and root, as in CI).
ui-deps:
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium for the dashboard's browser test"; \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 || \
	   (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)); \
	else echo "chromium missing and not root: the dashboard's browser test will be skipped"; fi

# jepsen-lite's system tools: nftables (partitions inside network namespaces), iproute2 (the
# namespaces and links; bench/sandbox.py's reference too) and libfaketime (clock faults).
# Installed from Debian when missing and running as root (CI); otherwise the harness says what
# it lacks and its tests fall back or skip.
jepsen-deps:
	@if command -v nft >/dev/null && command -v faketime >/dev/null && command -v ip >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing nftables, iproute2 and faketime for jepsen-lite"; \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iproute2 faketime >/dev/null 2>&1 || \
	   (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iproute2 faketime >/dev/null)); \
	else echo "jepsen-lite: nftables, iproute2 or faketime missing and not root: partition and clock runs will be skipped"; fi

# The jepsen-lite matrix: every workload under every nemesis on 5 nodes (about an hour).
JEPSEN_TIME ?= 60
jepsen: $(STAMP) jepsen-deps
	$(BIN)/xr-jepsen matrix --nodes 5 --time $(JEPSEN_TIME)

unit: $(STAMP)
	$(BIN)/pytest -m "not slow" -q

test-slow: $(STAMP)
	$(BIN)/pytest -m slow -q

# Rewrite the references generated from the code (their tests fail when they are out of date).
docs: $(STAMP)
	$(BIN)/python docs/gen_api_reference.py
	$(BIN)/python docs/gen_client_reference.py
	$(BIN)/python docs/gen_metrics.py

# Every benchmark in bench/, small, within a 20-minute budget; writes bench/results/summary.md.
bench: $(STAMP)
	$(BIN)/python bench/run_all.py

# The HTTP API against a 3-member etcd 3.4 cluster, interleaved (installs etcd-server if missing).
bench-api: $(STAMP)
	$(BIN)/python bench/api.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
