"""The migrated schema is exactly the models, on PostgreSQL (Lapse's tables in their own schema,
default or not) and on SQLite (the `lapse_` tables beside the business tables): tables, columns and
every index with its predicate (Alembic's comparison does not look at a partial index's WHERE)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from alembic import command
from sqlalchemy import inspect, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.schema import CreateIndex

from lapse.kernel.database import PARTITION_NAME, VERSION_TABLE, alembic_config, make_engine, upgrade_url
from lapse.kernel.ledger import APPLIED, CLAIMED, DEAD_LETTER, PENDING, UNFINISHED
from lapse.kernel.models import cleanup_ledger, ledger_transitions, metadata, metadata_in, outbox
from tests.fixtures.db import as_cluster_owner, migrations_head, schema_diff

LAPSE_TABLES = {"lapse_ledger", "lapse_transitions", "lapse_outbox", "lapse_daily_reports",
                "lapse_operator_actions", "lapse_findings", "lapse_pauses", "lapse_budget_usage",
                "lapse_shadow_effects", "lapse_limit_routes", "lapse_limit_slots", "lapse_limit_stats"}
HEAD = migrations_head()
PREVIOUS = "0004"
# 0004's indexes that 0005 replaced, and the ones it made.
INDEXES_0004 = {"ix_lapse_ledger_state_due", "ix_lapse_ledger_state_due_key", "ix_lapse_ledger_finished",
                "ix_lapse_transitions_op_key"}
INDEXES_0005 = {"ix_lapse_ledger_unfinished_due", "ix_lapse_ledger_dead_letters", "ix_lapse_transitions_failures",
                "ix_lapse_outbox_sent"}
# The one retention's prune added (0007), gone again below it.
INDEXES_0007 = {"ix_lapse_ledger_settled_finished"}


def pg_index_definitions(conn, schema: str) -> dict[str, str]:
    """Index name → its definition as PostgreSQL prints it (pg_get_indexdef), for Lapse's tables."""
    rows = conn.execute(text(
        "SELECT c.relname, pg_get_indexdef(c.oid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE n.nspname = :schema AND t.relname LIKE 'lapse\\_%' AND t.relname <> :version "
        "AND NOT i.indisprimary AND NOT t.relispartition"), {"schema": schema, "version": VERSION_TABLE})
    return dict(rows.all())


def model_index_definitions(conn, schema: str) -> dict[str, str]:
    """The models' indexes as PostgreSQL prints them: each created under a scratch name in a
    savepoint rolled back, then read back the same way."""
    scratch = conn.begin_nested()
    try:
        for table in metadata_in(schema).tables.values():
            for index in table.indexes:
                ddl = str(CreateIndex(index).compile(dialect=conn.dialect))
                conn.execute(text(ddl.replace(f"INDEX {index.name} ON", f"INDEX scratch_{index.name} ON", 1)))
        found = pg_index_definitions(conn, schema)
    finally:
        scratch.rollback()
    return {name.removeprefix("scratch_"): definition.replace(f"INDEX {name} ON", f"INDEX {name[8:]} ON")
            for name, definition in found.items() if name.startswith("scratch_")}


def test_migrated_schema_equals_models(db_url):
    assert schema_diff(db_url) == []


def test_migrated_indexes_and_their_predicates_equal_the_models(pg_url):
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            migrated = pg_index_definitions(conn, "lapse")
            modelled = model_index_definitions(conn, "lapse")
    finally:
        engine.dispose()
    assert migrated == modelled
    assert set(migrated) >= INDEXES_0005
    assert not INDEXES_0004 & set(migrated)


def test_sqlite_indexes_and_their_predicates_equal_the_models(sqlite_url):
    """SQLite keeps each index's CREATE statement: the predicate of every partial one is the
    models' (and the unfinished-due index is whole there, see models.py)."""
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            stored = dict(conn.exec_driver_sql(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name LIKE 'lapse%' "
                "AND sql IS NOT NULL").all())
    finally:
        engine.dispose()
    expected = {}
    for table in metadata.tables.values():
        for index in table.indexes:
            where = index.dialect_options["sqlite"]["where"]
            expected[index.name] = None if where is None else str(where)
    assert set(stored) == set(expected)
    for name, sql in stored.items():
        where = expected[name]
        assert (" WHERE " in sql) == (where is not None), sql
        if where is not None:
            assert sql.rstrip().endswith(f"WHERE {where}"), sql


def test_the_unfinished_index_covers_exactly_the_unfinished_states():
    index = next(i for i in cleanup_ledger.indexes if i.name == "ix_lapse_ledger_unfinished_due")
    where = str(index.dialect_options["postgresql"]["where"])
    assert where == "state IN (" + ", ".join(f"'{s}'" for s in UNFINISHED) + ")"


def plan(conn, sql: str, **params) -> str:
    return "\n".join(conn.execute(text("EXPLAIN " + sql), params).scalars())


def test_the_partial_indexes_serve_their_queries(pg_url):
    """On a ledger mostly finished, each partial index is the one its query reads (SET
    enable_seqscan off keeps a small test table from making a scan cheaper)."""
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL enable_seqscan = off"))
            conn.execute(text("SET LOCAL enable_bitmapscan = off"))
            cases = {
                "ix_lapse_ledger_unfinished_due": plan(
                    conn, "SELECT op_key FROM lapse.lapse_ledger WHERE state = :s AND due_at <= :now "
                    "ORDER BY due_at, op_key LIMIT 10", s=PENDING, now=now),
                "ix_lapse_ledger_claimed_until": plan(
                    conn, "SELECT count(*) FROM lapse.lapse_ledger WHERE state = :s AND claim_until < :now",
                    s=CLAIMED, now=now),
                "ix_lapse_ledger_dead_letters": plan(
                    conn, "SELECT op_key FROM lapse.lapse_ledger WHERE state = :s ORDER BY finished_at, op_key "
                    "LIMIT 10", s=DEAD_LETTER),
                "ix_lapse_transitions_failures": plan(
                    conn, "SELECT op_key FROM lapse.lapse_transitions WHERE op_key = :k "
                    "AND failure_class IS NOT NULL ORDER BY id", k="release-reservation:1"),
                "ix_lapse_outbox_sent": plan(conn, "SELECT id FROM lapse.lapse_outbox WHERE sent_at < :now", now=now),
            }
    finally:
        engine.dispose()
    for index, text_plan in cases.items():
        assert index in text_plan, f"{index} not used:\n{text_plan}"


def ledger_row(n: int, state: str, now: datetime) -> dict:
    return {"op_key": f"release-reservation:{n}", "kind": "release-reservation", "tenant": "t", "subject_id": str(n),
            "state": state, "due_at": now, "correlation_id": f"c{n}", "source": "sweep", "created_at": now,
            "updated_at": now, "finished_at": now if state in (APPLIED, DEAD_LETTER) else None}


def index_names(engine, schema: str | None) -> set[str]:
    """The names of the indexes on the ledger, transitions and outbox."""
    insp = inspect(engine)
    return {i["name"] for table in ("lapse_ledger", "lapse_transitions", "lapse_outbox")
            for i in insp.get_indexes(table, schema=schema)}


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_url(request, tmp_path) -> str:
    if request.param == "postgresql":
        return request.getfixturevalue("pg_empty_url")
    return f"sqlite:///{tmp_path / 'lapse.db'}"


def test_a_database_one_migration_behind_upgrades_keeping_its_rows_and_downgrades_back(empty_url):
    """0004 → head swaps the indexes (0005) and keeps every row; back to 0004 puts 0004's indexes back."""
    schema = "lapse" if make_url(empty_url).get_backend_name() == "postgresql" else None
    first = upgrade_url(empty_url, PREVIOUS)
    assert (first.before, first.after) == (None, PREVIOUS)
    engine = make_engine(empty_url)
    now = datetime.now(UTC)
    rows = [ledger_row(n, state, now) for n, state in enumerate((PENDING, CLAIMED, APPLIED, DEAD_LETTER), 1)]
    try:
        assert index_names(engine, schema) >= INDEXES_0004
        with engine.begin() as conn:
            conn.execute(cleanup_ledger.insert(), rows)
            conn.execute(ledger_transitions.insert(), [{"op_key": r["op_key"], "to_state": r["state"], "attempt": 0,
                                                        "actor": "test", "at": now} for r in rows])
            conn.execute(outbox.insert(), [{"topic": "t", "key": "k", "schema": "s", "payload": {}, "headers": {},
                                            "created_at": now, "sent_at": now}])

        change = upgrade_url(empty_url)

        assert (change.before, change.after) == (PREVIOUS, HEAD)
        assert schema_diff(empty_url) == []
        names = index_names(engine, schema)
        assert names >= INDEXES_0005 | INDEXES_0007
        assert not INDEXES_0004 & names
        with engine.connect() as conn:
            stored = conn.execute(select(cleanup_ledger.c.op_key, cleanup_ledger.c.state)
                                  .order_by(cleanup_ledger.c.op_key)).all()
            assert stored == sorted((r["op_key"], r["state"]) for r in rows)
            assert conn.execute(select(ledger_transitions.c.op_key)).scalars().all() != []

        cfg = alembic_config(empty_url)
        with engine.connect() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, PREVIOUS)
            conn.commit()
        names = index_names(engine, schema)
        assert names >= INDEXES_0004
        assert not (INDEXES_0005 | INDEXES_0007) & names
        with engine.connect() as conn:
            assert conn.execute(select(cleanup_ledger.c.op_key)).scalars().all() != []
    finally:
        engine.dispose()


def tables_but_partitions(insp, schema: str) -> set[str]:
    """The tables in `schema`, the time partitions of the partitioned ones (migration 0009) aside."""
    return {t for t in insp.get_table_names(schema=schema) if not PARTITION_NAME.fullmatch(t)}


def test_lapse_tables_are_in_their_own_namespace(db_url):
    engine = make_engine(db_url)
    try:
        insp = inspect(engine)
        if engine.dialect.name == "postgresql":
            assert tables_but_partitions(insp, "lapse") == LAPSE_TABLES | {VERSION_TABLE}
            assert set(insp.get_table_names(schema="public")) == {"reservations", "artifacts"}  # demo tables
        else:
            assert set(insp.get_table_names()) == LAPSE_TABLES | {VERSION_TABLE, "reservations", "artifacts"}
    finally:
        engine.dispose()
    assert {t.name for t in metadata.tables.values()} == LAPSE_TABLES


def test_a_schema_of_its_own_name_works(pg_empty_url):
    change = upgrade_url(pg_empty_url, schema="lapse_alt")
    assert (change.schema, change.before, change.after) == ("lapse_alt", None, HEAD)
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
        assert tables_but_partitions(insp, "lapse_alt") == LAPSE_TABLES | {VERSION_TABLE}
        assert not insp.has_schema("lapse")
        assert insp.get_table_names(schema="public") == []
    finally:
        engine.dispose()


def test_a_role_without_create_on_the_database_upgrades_into_a_schema_made_for_it(pg_empty_url, login_role):
    """PostgreSQL checks CREATE on the database even for CREATE SCHEMA IF NOT EXISTS: a schema a DBA
    made for Lapse's role is used as it is."""
    url = login_role(pg_empty_url)
    role, database = make_url(url).username, make_url(url).database
    as_cluster_owner(f'REVOKE CREATE ON DATABASE "{database}" FROM PUBLIC; '
                     f'CREATE SCHEMA lapse AUTHORIZATION "{role}"', database or "")
    change = upgrade_url(url)
    assert (change.before, change.after) == (None, HEAD)
    assert schema_diff(url) == []
