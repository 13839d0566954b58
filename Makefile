# The two commands of the README: `make run` and `make test`. Both install first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Spark's driver classes, parsed and verified once: an agent's session starts 4-7 s sooner
# (services/sparkpoint/agent/spark/class_archive.py)
ARCHIVE := $(VENV)/share/sparkpoint/spark-driver.jsa

.PHONY: install run test lint typecheck unit bench peers latency chaos compat lock clean

install: $(STAMP) $(ARCHIVE)

# Reinstall whenever the declared dependencies or the pinned lock change. pip byte-compiles every
# module it installs (about 40 s here): keep it, where PYTHONDONTWRITEBYTECODE is set (it is on
# this machine) nothing else would, and every process would compile its imports afresh
# (pandas, pyarrow, pyspark: 3.4-4.6 s instead of 1.1-1.4 s, in each agent and Spark worker).
$(STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "sparkpoint needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

$(ARCHIVE): $(STAMP)
	$(BIN)/python -m sparkpoint.agent.spark.class_archive $(ARCHIVE)

run: install
	$(BIN)/sparkpoint demo

lint: install
	$(BIN)/ruff check services tests bench
	$(BIN)/ruff format --check services tests bench

typecheck: install
	$(BIN)/mypy

# pytest exits 5 when it collects no test: make treats that as a failure, as it should.
# Where PYTHONDONTWRITEBYTECODE is set (it is on this machine) no process caches what it compiles:
# sparkpoint's own modules are compiled once here, not again in every coordinator, agent and
# Spark worker process the tests start (0.25 s each, measured).
test: lint typecheck
	$(BIN)/python -m compileall -q services/sparkpoint > /dev/null
	$(BIN)/pytest

unit: install
	$(BIN)/pytest -m unit

bench: install
	$(BIN)/python bench/codec.py
	$(BIN)/python bench/coordinator_core.py
	$(BIN)/python bench/coordinator_latency.py
	$(BIN)/python bench/coordinator_scale.py
	$(BIN)/python bench/flink_rest.py
	$(BIN)/python bench/history.py
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/cluster.py
	$(BIN)/python bench/unaligned.py
	$(BIN)/python bench/failover.py
	$(BIN)/python bench/recovery.py
	$(BIN)/python bench/state.py
	$(BIN)/python bench/books.py
	$(BIN)/python bench/planning.py
	$(BIN)/python bench/testing.py
	$(BIN)/python bench/time.py
	$(BIN)/python bench/security.py
	$(MAKE) latency
	$(MAKE) peers

# sparkpoint against quixstreams, bytewax, Spark Structured Streaming and a hand-written loop
# (bench/peers.py). quixstreams and bytewax get a venv of their
# own: quixstreams needs an older confluent-kafka than sparkpoint pins.
PEERS := .venv-peers
$(PEERS)/.installed: bench/peers-requirements.txt
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --disable-pip-version-check -r bench/peers-requirements.txt
	touch $@

peers: install $(PEERS)/.installed
	$(BIN)/python bench/peers.py

# End-to-end latency on live input, sparkpoint against the peers (bench/latency.py).
latency: install $(PEERS)/.installed
	$(BIN)/python bench/latency.py

# Flink's own tools against sparkpoint (tests/e2e/test_flink_tools.py): the real Flink 2.3 CLI and
# web dashboard from the apache-flink package (844 MB) and Playwright, in a venv of their own; the
# dashboard check drives Debian's Chromium (apt-get install chromium). Not part of `make test`.
COMPAT := .venv-compat
$(COMPAT)/.installed: tests/compat/requirements.txt
	test -x $(COMPAT)/bin/python || $(PYTHON) -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip install --quiet --disable-pip-version-check -r tests/compat/requirements.txt
	touch $@

compat: install $(COMPAT)/.installed
	@command -v chromium > /dev/null || echo "no chromium on the PATH: the dashboard test will be skipped (apt-get install chromium)"
	$(BIN)/pytest -p no:cacheprovider -rs tests/e2e/test_flink_tools.py tests/integration/test_flink_rest.py

# Kill-point and bad-event campaigns (bench/chaos.py): long. First the tests marked chaos, which
# `make test` leaves out (about 100 s each of its 25-minute budget).
chaos: install
	$(BIN)/pytest -m chaos
	$(BIN)/python bench/chaos.py --kill-points 100
	$(BIN)/python bench/chaos.py --events 10000

# Regenerate the pinned lock from a fresh resolution of pyproject.toml's lower bounds.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	echo '# Pinned versions for every install (make lock rewrites this file).' > constraints.txt
	.lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^sparkpoint' >> constraints.txt
	rm -rf .lock-venv

clean:
	rm -rf $(VENV) $(PEERS) $(COMPAT) .pytest_cache .mypy_cache .ruff_cache
