"""The suite's root: wires the fixtures package and marks each test by the folder it lives in.

unit/         no broker, no external service (an in-process SQLite file at most): the fast loop
integration/  Apache Kafka and/or PostgreSQL
system/       a three-broker cluster, the demo, the bench, million-row runs
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.db", "tests.fixtures.pipeline", "tests.fixtures.effects",
                  "tests.fixtures.wheel"]

KINDS = ("unit", "integration", "system")
# What a unit test may not ask for: a broker or PostgreSQL (sqlite_url is fine).
NOT_FOR_UNIT = {"kafka_bootstrap", "kafka_server", "embedded_bootstrap", "_kafka_under_test",
                "pg_template", "pg_url", "pg_empty_url", "db_url", "engine", "pipeline"}


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
