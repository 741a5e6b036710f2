# Set-up is two commands on a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Most tests wait on a broker process rather than compute, so more workers than cores
# pay off (README.md, Testing). Under loadgroup, tests/conftest.py's scheduler keeps the
# Spark tests on one worker: they share one SparkSession (tests/spark/conftest.py).
TEST_WORKERS ?= 4
PYTEST_PARALLEL = -n $(TEST_WORKERS) --dist loadgroup
# Each broker a test starts, and each client process, imports about a hundred of our
# modules. Where PYTHONDONTWRITEBYTECODE is set (these machines set it), every such process
# compiled them from source again: 0.2 s of a broker's 0.5 s start, hundreds of times a run.
# The tests and benchmarks write the bytecode cache (__pycache__, ignored by git) once
# instead, as Python does by default.
WRITE_BYTECODE := PYTHONDONTWRITEBYTECODE=
PYTEST := $(WRITE_BYTECODE) $(PY) -m pytest

.PHONY: run test test-fast lint format bench bench-quick clean check-java check-promtool check-kcat test-reliability fuzz soak txn-history

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark]'
	touch $(STAMP)

# `make run PORT=9093 METRICS_PORT=9645 DATA_DIR=/tmp/b2 ARGS='--log-level debug'`: each
# variable given becomes its flag and ARGS is appended; the broker's defaults
# (docs/configuration.md) hold the rest. Only make's command line counts: a PORT
# exported for something else must not move the broker.
given = $(filter command line,$(origin $(1)))
flag = $(if $(call given,$(1)),$(2) '$($(1))')
SERVE_FLAGS = $(call flag,PORT,--port) $(call flag,METRICS_PORT,--metrics-port) \
	$(call flag,DATA_DIR,--data-dir) $(if $(call given,ARGS),$(ARGS))
run: $(STAMP)
	$(VENV)/bin/minibroker $(strip serve $(SERVE_FLAGS))

test: $(STAMP) check-java check-promtool check-kcat lint
	$(PYTEST) -q $(PYTEST_PARALLEL) $(PYTEST_ARGS)

# The pure and unit tests: no broker process (marker `wire`, tests/conftest.py), no Spark.
test-fast: $(STAMP)
	$(PYTEST) -q $(PYTEST_PARALLEL) -m 'not wire and not spark and not slow' $(PYTEST_ARGS)

# The reliability suite at full sizes (tests/reliability; `make test` runs its quick sizes).
test-reliability: $(STAMP)
	MINIBROKER_RELIABILITY=full $(PYTEST) -q -s tests/reliability $(PYTEST_ARGS)

# Coverage-guided fuzzing of the frame, request and batch decoders (atheris).
# Crash inputs land in tests/reliability/crashes/ and are replayed by the suite.
FUZZ_SECONDS ?= 300
fuzz: $(STAMP)
	@if ! $(PY) -m pip install --quiet -e '.[fuzz]'; then \
	  echo "make fuzz: atheris did not build or install here (it needs clang/libFuzzer); skipped"; \
	else \
	  $(PY) -m tests.reliability.make_corpus && \
	  mkdir -p .fuzz-corpus tests/reliability/crashes && \
	  $(PY) -m tests.reliability.fuzz .fuzz-corpus tests/reliability/corpus \
	    -artifact_prefix=tests/reliability/crashes/ -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048; \
	fi

# Mixed load with a broker restart every minute; writes soak-out/soak.csv and soak.png.
SOAK_SECONDS ?= 600
soak: $(STAMP)
	$(PY) -m pip install --quiet -e '.[soak]'
	SOAK_SECONDS=$(SOAK_SECONDS) $(PY) -m tests.reliability.soak

# Transactions under a kill -9 every few seconds, each read back against what the SDK
# reported (a Jepsen-style history check); writes txn-history-out/. The other settings
# (TXN_HISTORY_BACKENDS, _PRODUCERS, _KILL_SECONDS, _SEED, ...) are read from the environment;
# TXN_HISTORY_CLIENT=confluent runs confluent-kafka's producers and consumers through a
# kafka listener instead of the SDK.
TXN_HISTORY_TRANSACTIONS ?= 50000
txn-history: $(STAMP)
	TXN_HISTORY_TRANSACTIONS=$(TXN_HISTORY_TRANSACTIONS) $(PY) -m tests.reliability.txn_history

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The peers (redis-server, nats-server) come from Debian's packages when missing;
# a suite that cannot have one says so in its rows and skips it.
bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(WRITE_BYTECODE) $(PY) -m bench

bench-quick: $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(WRITE_BYTECODE) $(PY) -m bench --scale 0.1

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "make test: 'java' not found. pyspark 4.x needs Java 17 for the Spark tests."; \
	  echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jre-headless"; \
	  echo "  macOS:         brew install openjdk@17"; \
	  exit 1; }

# promtool and prometheus (Debian's `prometheus` package) check deploy/ and
# back the Prometheus integration test.
check-promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's prometheus package (promtool, prometheus)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null) \
	      || { echo "make test: could not install prometheus; run: sudo apt-get install -y prometheus"; exit 1; }; \
	  else \
	    echo "make test: 'promtool' not found. Install it: sudo apt-get install -y prometheus"; exit 1; \
	  fi; }

# kcat (Debian's `kcat` package, librdkafka's command-line client) backs the Kafka
# listener's kcat tests, which would otherwise be skipped.
check-kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's kcat package"; \
	    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kcat >/dev/null \
	      || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kcat >/dev/null)) \
	      || { echo "make test: could not install kcat; run: sudo apt-get install -y kcat"; exit 1; }; \
	  else \
	    echo "make test: 'kcat' not found. Install it: sudo apt-get install -y kcat"; exit 1; \
	  fi; }

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
