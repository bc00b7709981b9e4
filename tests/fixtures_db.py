"""Database fixtures: a migrated template per session, a fresh clone of it per test.

PostgreSQL clones with `CREATE DATABASE … TEMPLATE` (fast, no migrations per test); SQLite
copies the migrated file. A missing PostgreSQL fails the run with the reason; it is never skipped.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from lapse.kernel.database import make_engine, upgrade_url

DEFAULT_ADMIN_URL = "postgresql+psycopg://lapse@127.0.0.1:5432/lapse"


def admin_url() -> str:
    return os.environ.get("LAPSE_TEST_DATABASE_URL", DEFAULT_ADMIN_URL)


def _admin_engine():
    return create_engine(admin_url(), isolation_level="AUTOCOMMIT")


def _drop(conn, name: str) -> None:
    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"lapse_tpl_{uuid.uuid4().hex[:8]}"
    engine = _admin_engine()
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        pytest.fail(f"PostgreSQL at {admin_url()} is not reachable ({type(exc).__name__}): "
                    "run `make postgres` or set LAPSE_TEST_DATABASE_URL", pytrace=False)
    url = make_url(admin_url()).set(database=name).render_as_string(hide_password=False)
    upgrade_url(url)
    yield name
    with engine.connect() as conn:
        _drop(conn, name)
    engine.dispose()


@pytest.fixture
def pg_url(pg_template: str) -> Iterator[str]:
    """A fresh PostgreSQL database, migrated, for this test only."""
    name = f"lapse_t_{uuid.uuid4().hex[:10]}"
    engine = _admin_engine()
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"'))
    yield make_url(admin_url()).set(database=name).render_as_string(hide_password=False)
    with engine.connect() as conn:
        _drop(conn, name)
    engine.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    upgrade_url(f"sqlite:///{path}")
    return str(path)


@pytest.fixture
def sqlite_url(sqlite_template: str, tmp_path) -> str:
    """A fresh SQLite file, migrated, for this test only."""
    path = tmp_path / "lapse.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request) -> str:
    """Runs the test once on PostgreSQL and once on SQLite (the embedded default)."""
    return request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")


@pytest.fixture
def engine(pg_url: str):
    """An engine on a fresh PostgreSQL database."""
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()
