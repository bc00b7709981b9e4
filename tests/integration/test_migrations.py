"""The migrated schema is exactly the models, on PostgreSQL (Lapse's tables in their own schema,
default or not) and on SQLite (the `lapse_` tables beside the business tables)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import create_engine, inspect, select, text
from sqlalchemy.engine import make_url

from lapse.kernel.database import VERSION_TABLE, make_engine, upgrade_url
from lapse.kernel.ledger import PENDING
from lapse.kernel.models import cleanup_ledger, metadata
from tests.fixtures.db import schema_diff

LAPSE_TABLES = {"lapse_ledger", "lapse_transitions", "lapse_outbox", "lapse_daily_reports"}


def test_migrated_schema_equals_models(db_url):
    assert schema_diff(db_url) == []


def test_lapse_tables_are_in_their_own_namespace(db_url):
    engine = make_engine(db_url)
    try:
        insp = inspect(engine)
        if engine.dialect.name == "postgresql":
            assert set(insp.get_table_names(schema="lapse")) == LAPSE_TABLES | {VERSION_TABLE}
            assert set(insp.get_table_names(schema="public")) == {"reservations", "artifacts"}  # demo tables
        else:
            assert set(insp.get_table_names()) == LAPSE_TABLES | {VERSION_TABLE, "reservations", "artifacts"}
    finally:
        engine.dispose()
    assert {t.name for t in metadata.tables.values()} == LAPSE_TABLES


def test_a_schema_of_its_own_name_works(pg_empty_url):
    change = upgrade_url(pg_empty_url, schema="lapse_alt")
    assert (change.schema, change.before, change.after) == ("lapse_alt", None, "0004")
    assert schema_diff(pg_empty_url, "lapse_alt") == []

    engine = make_engine(pg_empty_url, schema="lapse_alt")
    now = datetime.now(UTC)
    row = {"op_key": "release-reservation:1", "kind": "release-reservation", "tenant": "t", "subject_id": "1",
           "state": PENDING, "due_at": now, "correlation_id": "c1", "source": "sweep", "created_at": now,
           "updated_at": now}
    try:
        with engine.begin() as conn:
            conn.execute(cleanup_ledger.insert(), row)
        with engine.connect() as conn:
            stored = conn.execute(select(cleanup_ledger)).mappings().one()
        assert {k: stored[k] for k in row} == row
        insp = inspect(engine)
        assert set(insp.get_table_names(schema="lapse_alt")) == LAPSE_TABLES | {VERSION_TABLE}
        assert not insp.has_schema("lapse")
        assert insp.get_table_names(schema="public") == []
    finally:
        engine.dispose()


def test_a_role_without_create_on_the_database_upgrades_into_a_schema_made_for_it(pg_empty_url):
    """PostgreSQL checks CREATE on the database even for CREATE SCHEMA IF NOT EXISTS: a schema a DBA
    made for Lapse's role is used as it is."""
    role = f"lapse_r_{uuid.uuid4().hex[:8]}"
    admin = create_engine(pg_empty_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{role}" LOGIN'))
        conn.execute(text(f'REVOKE CREATE ON DATABASE "{make_url(pg_empty_url).database}" FROM PUBLIC'))
        conn.execute(text(f'CREATE SCHEMA lapse AUTHORIZATION "{role}"'))
    url = make_url(pg_empty_url).set(username=role).render_as_string(hide_password=False)
    try:
        change = upgrade_url(url)
        assert (change.before, change.after) == (None, "0004")
        assert schema_diff(url) == []
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP OWNED BY "{role}"'))
            conn.execute(text(f'DROP ROLE "{role}"'))
        admin.dispose()
