# Every target sets up what it needs from nothing and is safe to run again.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
JARS := build/kafka/libs/.resolved

.PHONY: help demo check lint docs test test-pythons scale storm bench soak broker venv postgres kafka-jars quix-peer chromium promtool clean

help:
	@echo "make demo       - the pipeline end to end on the embedded broker and SQLite"
	@echo "make check      - the fast loop: ruff, mypy, import contracts, then tests/unit (no broker)"
	@echo "make lint       - ruff, mypy, the import contracts and vulture (dead code) only"
	@echo "make test       - ruff, mypy, import contracts, then the whole suite on Apache Kafka and PostgreSQL"
	@echo "make test-pythons - the unit tests on every Python 3.11+ this machine has (pyenv's or python3.X), a .venv-3.X each"
	@echo "make docs       - the docs site (part of make test): references generated from the models, mkdocs build --strict into build/site"
	@echo "make scale      - the tests on millions of rows and minutes of load (2,000,000-row prune plans, a short soak, the bench smoke)"
	@echo "make storm      - the kill storm: random SIGKILLs of workers and relays for 60 s over 20,000 events"
	@echo "make bench      - the benchmark (JSON on stdout)"
	@echo "make soak       - 10 minutes of steady load over a 2,000,000-row ledger with pruning (JSON on stdout)"
	@echo "make broker     - a Kafka broker on loopback in the foreground (embedded tansu)"
	@echo "make venv       - the virtual environment in .venv with the test, check and docs extras"
	@echo "make postgres   - install (where missing) and start the local PostgreSQL"
	@echo "make kafka-jars - fetch the Apache Kafka server jars into build/kafka/libs"
	@echo "make quix-peer  - the bench's Quix Streams peer in its own environment, build/quix-venv"
	@echo "make chromium   - install (where missing) Debian's chromium and chromium-driver for the console tests"
	@echo "make promtool   - install (where missing) promtool, which checks the Prometheus alert rules"
	@echo "make clean      - remove the demo state, the fetched jars and the built docs"
	@echo "make help       - this list"

venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,check,docs]'
	@rm -f $(VENV)/.installed-* && touch $@

postgres:
	@scripts/ensure-postgres.sh

chromium:
	@scripts/ensure-chromium.sh

promtool:
	@scripts/ensure-promtool.sh

kafka-jars: $(JARS)
$(JARS): build/kafka/pom.xml
	@scripts/ensure-java.sh
	mvn -q -B -f build/kafka/pom.xml dependency:copy-dependencies
	@touch $@

demo: venv
	$(BIN)/lapse demo

lint: venv
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/vulture

# Hypothesis' quick profile caps every property at a few examples; `make test` runs their own counts.
check: lint
	$(BIN)/pytest -q --hypothesis-profile=quick tests/unit

# The reference pages are generated from the settings and declaration models (not committed).
docs: venv
	$(BIN)/python -m lapse.devtools.docs_reference docs/reference
	$(BIN)/mkdocs build --strict --quiet

test: lint docs postgres kafka-jars chromium promtool
	$(BIN)/pytest -n 2 -m "not bench and not storm and not scale" -q --durations=15

# Each Python 3.11+ found (pyenv's versions, or python3.X on PATH) in a virtual environment of its
# own, .venv-3.X; one line per Python. TEST_ARGS="tests/unit tests/integration" runs more.
test-pythons:
	@scripts/test-pythons.sh

scale: venv postgres kafka-jars quix-peer
	$(BIN)/pytest -n 2 -m scale -q

storm: venv postgres kafka-jars
	$(BIN)/pytest -m storm -q -s tests/system/test_kill_storm.py

# quixstreams pins an older confluent-kafka than Lapse's: the bench's peer has an environment of its own.
QUIX := build/quix-venv/.installed
quix-peer: $(QUIX)
$(QUIX):
	@test -x build/quix-venv/bin/python || $(PYTHON) -m venv build/quix-venv
	build/quix-venv/bin/pip install -q --disable-pip-version-check 'quixstreams==3.28.1' 'psycopg[binary]>=3.1' 'fastavro>=1.9'
	@touch $@

bench: venv postgres kafka-jars quix-peer
	$(BIN)/lapse bench --json

soak: venv postgres kafka-jars
	$(BIN)/lapse soak --minutes 10 --json

broker: venv
	$(BIN)/lapse broker

clean:
	rm -rf .lapse build/kafka/libs build/site docs/reference build/quix-venv
