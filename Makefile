# hotstate: `make demo` and `make test` each work alone on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest bench clean venv

# Re-install when pyproject.toml changes (the stamp is older) or the venv is missing.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "hotstate needs Python >= 3.11, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-cache-dir -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m hotstate.cli.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

pytest: $(STAMP)
	$(VENV)/bin/pytest -n 2 -q

test: lint typecheck pytest

bench: $(STAMP)
	$(PY) bench/log_append.py
	$(PY) bench/raft_sim.py
	$(PY) bench/assignor.py
	$(PY) bench/rpc.py
	$(PY) bench/metadata.py
	$(PY) bench/replication.py
	$(PY) bench/pull_queries.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
