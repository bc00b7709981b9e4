"""The suite's root: wires the fixtures package and marks each test by the folder it lives in.

unit/         no broker, no external service (an in-process SQLite file at most): the fast loop
integration/  Apache Kafka and/or PostgreSQL
system/       a three-broker cluster, the demo, the bench, million-row runs

`make test` runs the suite on two pytest-xdist workers (`-n 2`; `--dist loadgroup` is in
pyproject.toml's addopts and only matters with -n). Each worker is its own pytest session with its
own session fixtures (its own broker, template database, wheel, temp folders), so nothing a session
creates may have a fixed name. Three rules keep the workers from disturbing each other:
- GROUPS: a group's modules run whole, in order, on one worker. "heavy" holds the tests that load the
  whole machine (several brokers or `lapse` processes, a storm, the bench), so they never run beside
  each other; "wheel" the tests of the built wheel, so it is built once. The scheduler below reads
  GROUPS by module path: with pytest 9.2, xdist's own `xdist_group` marks are silently ignored
  (pytest-xdist#1386), so list a new module here rather than marking it.
- `@pytest.mark.alone`: the test runs while the other worker runs nothing (it waits for the test
  there to end and holds back the next), for bounds measured in seconds that a second worker's load
  could stretch.
- Hypothesis' per-example deadline is widened, and `make check` runs a quick profile (see below).
"""

from __future__ import annotations

import fcntl
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.db", "tests.fixtures.pipeline", "tests.fixtures.effects",
                  "tests.fixtures.wheel", "tests.fixtures.secure_kafka", "tests.fixtures.private_postgres",
                  "tests.fixtures.compose", "tests.fixtures.archive"]

KINDS = ("unit", "integration", "system")
# What a unit test may not ask for: a broker or PostgreSQL (sqlite_url is fine).
NOT_FOR_UNIT = {"kafka_bootstrap", "kafka_server", "embedded_bootstrap", "_kafka_under_test",
                "pg_template", "pg_url", "pg_empty_url", "db_url", "engine", "pipeline", "secure_kafka",
                "login_role", "three_brokers", "private_postgres", "moto_server"}
# Module (under tests/) -> the xdist group its tests run in with -n (see the module docstring).
GROUPS = {
    "system/test_bench.py": "heavy",  # the quick bench: every stage, naive and Faust consumers, 1 and 2 workers
    "system/test_cluster.py": "heavy",  # three more Apache Kafka brokers, one killed
    "system/test_compose_processes.py": "heavy",  # three brokers and compose's 12 `lapse` processes
    "system/test_demo.py": "heavy",  # its own embedded broker and workers under injected faults
    "system/test_kill_storm.py": "heavy",  # `make storm`
    "system/test_rebalance_storm.py": "heavy",  # `lapse process` and `lapse run` processes SIGTERMed in turn
    "integration/test_outages.py": "heavy",  # `lapse run` (7 roles) through 10 s outages; a connect-timeout bound
    "integration/test_hostile_delay_headers.py": "heavy",  # delay-tier workers over fuzzed records
    "integration/test_acls.py": "secured",  # the SASL_SSL broker with an authorizer, started once
    "integration/test_secured_broker.py": "secured",
    "system/test_wheel.py": "wheel",  # the `installed` fixture: the wheel built and installed once a session
    "system/test_own_tables.py": "wheel",
}

# Hypothesis' default deadline (200 ms an example) is a speed check, not a property of the code under
# test: two workers on two cores stretch examples past it. A test's own `@settings(deadline=…)` wins.
# Two profiles: "thorough" (the default, `make test`) runs every property's own number of examples;
# "quick" (`make check`: `--hypothesis-profile=quick`) runs at most QUICK_EXAMPLES of each, whatever
# the test asks for (see pytest_collection_modifyitems), so the fast loop stays fast and the
# thorough run is where the counts are met.
QUICK_PROFILE = "quick"
QUICK_EXAMPLES = 10
hypothesis_settings.register_profile("thorough", deadline=timedelta(seconds=5))
hypothesis_settings.register_profile(QUICK_PROFILE, deadline=timedelta(seconds=5), max_examples=QUICK_EXAMPLES)
hypothesis_settings.load_profile("thorough")


@pytest.fixture(autouse=True)
def _lapse_logging_restored() -> Iterator[None]:
    """A command run in the test process configures the `lapse` logger (its level, handler and
    propagation): put it back after each test, so one test's command never silences another's logs."""
    logger = logging.getLogger("lapse")
    saved = (logger.level, list(logger.handlers), logger.propagate)
    yield
    logger.setLevel(saved[0])
    logger.handlers[:] = saved[1]
    logger.propagate = saved[2]


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        try:
            kind = item.path.relative_to(root).parts[0]
        except ValueError:  # collected from outside tests/
            continue
        if kind not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: a test module belongs in tests/unit, "
                                    "tests/integration or tests/system")
        if kind == "unit" and (wants := NOT_FOR_UNIT.intersection(getattr(item, "fixturenames", ()))):
            raise pytest.UsageError(f"{item.nodeid}: a unit test needs no broker or PostgreSQL, "
                                    f"but asks for {sorted(wants)}; move it to tests/integration")
        item.add_marker(kind)
    if config.getoption("--hypothesis-profile", None) == QUICK_PROFILE:
        for item in items:
            _at_most_quick_examples(getattr(item, "obj", None))


def _at_most_quick_examples(test: Any) -> None:
    """Cap a Hypothesis test's own `@settings(max_examples=…)` at the quick profile's count. The
    settings live on the wrapped test (Hypothesis reads them when the test runs); a test without
    them already took the quick profile's."""
    own = getattr(test, "_hypothesis_internal_use_settings", None)
    if isinstance(own, hypothesis_settings) and own.max_examples > QUICK_EXAMPLES:
        test._hypothesis_internal_use_settings = hypothesis_settings(own, max_examples=QUICK_EXAMPLES)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, called on the controller
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` with GROUPS: a module listed there is one work unit of its group; any other
    test is a unit of its own (or of its `xdist_group`, where xdist still marks node ids)."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0].removeprefix("tests/")
            return GROUPS.get(module) or super()._split_scope(nodeid)

    return ModuleGroups(config, log)


def _lock_base(config: pytest.Config) -> Path | None:
    """Where the workers of this run keep the `alone` locks (None: not an xdist worker)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    basetemp = config.option.basetemp  # <the run's temp root>/popen-gwN, set by xdist
    if basetemp:
        return Path(basetemp).parent / "lapse-xdist"
    return Path(tempfile.gettempdir()) / f"lapse-xdist-{workerinput['testrunuid']}"


@contextmanager
def _turn(base: Path, alone: bool) -> Iterator[None]:
    """A readers-writer lock over the run's workers: every test holds `.run` shared, an `alone` test
    holds it exclusively. `.gate` makes it fair: an `alone` test waiting at `.run` holds the gate,
    so the other worker starts no new test meanwhile."""
    with open(f"{base}.gate", "a") as gate, open(f"{base}.run", "a") as run:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(run, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(run, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    base = _lock_base(item.config)
    if base is None:
        return (yield)
    with _turn(base, item.get_closest_marker("alone") is not None):
        return (yield)
