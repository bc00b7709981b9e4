# Every target sets up what it needs from nothing and is safe to run again.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
JARS := build/kafka/libs/.resolved

.PHONY: all demo test bench venv postgres kafka-jars broker clean help

help:
	@echo "make demo   - the pipeline end to end on the embedded broker and SQLite"
	@echo "make test   - the whole suite on Apache Kafka and PostgreSQL"
	@echo "make bench  - the benchmark (JSON on stdout)"

venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test,embedded,bench]'
	@rm -f $(VENV)/.installed-* && touch $@

postgres:
	@scripts/ensure-postgres.sh

kafka-jars: $(JARS)
$(JARS): build/kafka/pom.xml
	@scripts/ensure-java.sh
	mvn -q -B -f build/kafka/pom.xml dependency:copy-dependencies
	@touch $@

demo: venv
	$(BIN)/lapse demo

test: venv postgres kafka-jars
	$(BIN)/pytest -m "not bench" -q

bench: venv postgres kafka-jars
	$(BIN)/lapse bench --json

broker: venv
	$(BIN)/lapse broker

clean:
	rm -rf .lapse build/kafka/libs
