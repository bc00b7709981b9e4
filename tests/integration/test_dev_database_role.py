"""The development role scripts/ensure-postgres.sh makes has LOGIN and CREATEDB only: no predefined
role such as pg_signal_backend (which lets a role end any non-superuser's session). What needed it,
dropping a test database WITH (FORCE) while a session it cannot end is there (an autovacuum worker,
another role's), is done without it: the dropping role ends its own sessions, and a plain DROP
DATABASE stops autovacuum workers itself (`lapse.devtools.bench.databases.drop_database`, used by
the test fixtures and the bench)."""

from __future__ import annotations

import re
import secrets
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from lapse.devtools.bench.databases import drop_database
from lapse.kernel.settings import REPO_ROOT
from tests.fixtures.db import admin_url, as_cluster_owner

SCRIPT = REPO_ROOT / "scripts" / "ensure-postgres.sh"


def test_the_script_grants_no_predefined_role_and_takes_pg_signal_backend_back():
    script = SCRIPT.read_text()
    grants = re.findall(r"GRANT (\w+) TO lapse", script)
    assert grants == []
    assert 'admin_sql -c "REVOKE pg_signal_backend FROM lapse"' in script


@pytest.fixture
def createdb_role():
    """A LOGIN CREATEDB role outside every predefined role, as the script makes `lapse`; its URL."""
    role, password = f"lapse_d_{uuid.uuid4().hex[:8]}", secrets.token_hex(16)
    as_cluster_owner(f"CREATE ROLE \"{role}\" LOGIN CREATEDB PASSWORD '{password}'", "postgres")
    yield make_url(admin_url()).set(username=role, password=password, database="postgres")
    as_cluster_owner(f'DROP ROLE IF EXISTS "{role}"', "postgres")


def test_a_database_with_open_sessions_is_dropped_without_pg_signal_backend(createdb_role):
    """FORCE is refused the role while a session it may not end is there; the drop the fixtures
    use takes a database whose own sessions are still open."""
    name = f"lapse_d_{uuid.uuid4().hex[:10]}"
    admin = create_engine(createdb_role, isolation_level="AUTOCOMMIT")
    own = create_engine(createdb_role.set(database=name))
    other = create_engine(make_url(admin_url()).set(database=name))
    try:
        with admin.connect() as conn:
            assert not conn.execute(text("SELECT pg_has_role('pg_signal_backend', 'MEMBER')")).scalar()
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        session = own.connect()
        session.execute(text("SELECT 1"))  # a session of its own, left open
        with other.connect() as conn:
            conn.execute(text("SELECT 1"))  # another role's, which it may not end (kept in the pool)
        with admin.connect() as conn, pytest.raises(DBAPIError) as refused:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        assert refused.value.orig.sqlstate == "42501"  # type: ignore[union-attr]
        other.dispose()
        with admin.connect() as conn:
            drop_database(conn, name)
            assert conn.execute(text("SELECT count(*) FROM pg_database WHERE datname = :n"), {"n": name}).scalar() == 0
        session.invalidate()  # ended by the drop
    finally:
        other.dispose()
        with admin.connect() as conn:
            drop_database(conn, name)
        admin.dispose()
        own.dispose()
