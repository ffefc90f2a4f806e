# hotstate: `make demo` and `make test` each work alone on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Python caches compiled modules (__pycache__, ignored by git) even where the environment says not to: without
# the cache every process compiles hotstate's source again, a quarter of a server's start (measured: 2.0 ->
# 1.65 s of CPU to ready), and the suite starts hundreds of servers, CLI and Spark worker processes.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test quick lint typecheck pytest bench bench-report bench-tools clean venv java ksql-client chromium curl net-tools chaos

# Re-install when pyproject.toml changes (the stamp is older) or the venv is missing.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "hotstate needs Python >= 3.11, found " + sys.version' 
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-cache-dir -e '.[dev,spark]'
	@touch $(STAMP)

venv: $(STAMP)

# PySpark (the sink and its tests) needs a Java runtime; Spark 4 runs on Java 17.
java:
	@command -v java >/dev/null || (apt-get update && apt-get install -y --no-install-recommends openjdk-17-jre-headless)

# tests/cluster/test_console.py drives Debian's Chromium through the console page (/ui) with Playwright for
# Python; Playwright's own browser download is never used.
chromium:
	@test -x /usr/bin/chromium || (apt-get update && apt-get install -y --no-install-recommends chromium)

# tests/cluster/test_query_stream.py drives curl (HTTP/2 by upgrade and with prior knowledge).
curl:
	@command -v curl >/dev/null || (apt-get update && apt-get install -y --no-install-recommends curl)

# ksqlDB's Python client (ksql-python-ng) in a venv of its own: its HTTP/1.1 path needs httpx < 0.28, which
# hotstate's own client does not pin; tests/cluster/test_query_stream.py runs it unmodified from there.
KSQL_CLIENT := $(VENV)/ksql-client
$(KSQL_CLIENT)/.installed: $(STAMP)
	@test -x $(KSQL_CLIENT)/bin/python || $(PYTHON) -m venv $(KSQL_CLIENT)
	$(KSQL_CLIENT)/bin/python -m pip install --quiet --no-cache-dir 'ksql-python-ng==0.29.0.1' 'httpx<0.28'
	@touch $@

ksql-client: $(KSQL_CLIENT)/.installed

# The chaos harness (hotstate.chaos, tests/chaos) builds network namespaces with `ip` and `tc` (iproute2) and
# injects faults with `nft` (nftables); as root. Without root the chaos tests skip and say why.
net-tools:
	@command -v ip >/dev/null && command -v tc >/dev/null && command -v nft >/dev/null \
		|| (apt-get update && apt-get install -y --no-install-recommends iproute2 nftables)

demo: $(STAMP) java
	$(PY) -m hotstate.cli.demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy

# loadgroup: each xdist group runs whole on one worker; the Spark tests are two groups ("spark", "spark-2"),
# one per worker, each with that worker's one SparkSession (tests/spark/conftest.py). --durations: the
# slowest tests in every run's output, to see what the run's time goes to.
pytest: $(STAMP) java chromium curl ksql-client net-tools
	$(VENV)/bin/pytest -n 2 --dist loadgroup -q --durations=40

test: lint typecheck pytest

# The fast loop: lint, types and the tests that start no server process and no Spark (tests/conftest.py
# marks the others `slow`, with the simulator soaks), so it needs no Java. `make test` still runs all.
quick: lint typecheck
	$(VENV)/bin/pytest -n 2 -q -m "not slow"

# bench/pull_queries.py and bench/http_servers.py: wrk (HTTP/1.1 load), h2load (HTTP/2 load, nghttp2-client),
# redis-server + redis-benchmark (the Redis baseline).
bench-tools: $(STAMP)
	$(PY) -m pip install --quiet --no-cache-dir -e '.[dev,spark,bench]'
	@command -v wrk >/dev/null && command -v h2load >/dev/null && command -v redis-server >/dev/null \
		&& command -v redis-benchmark >/dev/null \
		|| (apt-get update && apt-get install -y --no-install-recommends wrk nghttp2-client redis-server redis-tools)

bench: $(STAMP) java bench-tools net-tools
	$(PY) bench/log_append.py
	$(PY) bench/raft_sim.py
	$(PY) bench/assignor.py
	$(PY) bench/rpc.py
	$(PY) bench/metadata.py
	$(PY) bench/replication.py
	$(PY) bench/http_servers.py
	$(PY) bench/pull_queries.py
	$(PY) bench/spark_sink.py
	$(PY) bench/freshness.py
	$(PY) bench/write_failover.py
	$(PY) bench/cross_rack.py
	$(PY) bench/report.py

# Seeded chaos schedules against real servers in network namespaces (docs/chaos.md); every seed is printed
# and replays with `python -m hotstate.chaos --seed N --schedules 1` (and the same other options).
# Writes bench/results/chaos.json, then docs/benchmarks.md. Needs root.
CHAOS_SCHEDULES ?= 10
CHAOS_DURATION ?= 90
CHAOS_SERVERS ?= 5
CHAOS_SEED ?=
chaos: $(STAMP) net-tools
	$(PY) -m hotstate.chaos --schedules $(CHAOS_SCHEDULES) --duration $(CHAOS_DURATION) \
		--servers $(CHAOS_SERVERS) --racks 3 --rack-rate 100mbit $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) \
		--out bench/results/chaos.json
	$(PY) bench/report.py

# docs/benchmarks.md from bench/results/*.json (tests/docs checks that they agree).
bench-report: $(STAMP)
	$(PY) bench/report.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
