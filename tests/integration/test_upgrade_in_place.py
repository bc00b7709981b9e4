"""Upgrading a database created by the previous head (0003: Lapse's unprefixed tables and
`alembic_version` in the default schema) moves Lapse's tables into their namespace and keeps every
row; the business tables stay where they were. A fresh install leaves a user's own `outbox` and
another application's `alembic_version` alone. On PostgreSQL and on SQLite."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import Column, Integer, MetaData, String, Table, func, insert, inspect, select
from sqlalchemy.engine import make_url

from lapse.devtools.demo_tables import artifacts, reservations
from lapse.kernel.batch_sql import bulk_insert
from lapse.kernel.database import UpgradeRefused, make_engine, upgrade_url
from lapse.kernel.models import cleanup_ledger, daily_reports, ledger_transitions, outbox
from lapse.shell.app import main
from tests.fixtures.db import build_legacy_layout, migrations_head, password_of, schema_diff

# Lapse's tables by their name in the previous layout.
LEGACY_NAMES = {cleanup_ledger: "cleanup_ledger", ledger_transitions: "ledger_transitions",
                outbox: "outbox", daily_reports: "daily_reports"}
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
# The head: 0004 moves the tables in place, 0005 changes their indexes, 0006 adds a table, 0007 adds
# retention's index, 0008 the findings table, the events' positions and the correlation index.
HEAD = migrations_head()


@pytest.fixture(params=["postgresql", "sqlite"])
def empty_url(request, tmp_path) -> str:
    """An empty database: a fresh PostgreSQL database, or a new SQLite file."""
    if request.param == "postgresql":
        return request.getfixturevalue("pg_empty_url")
    return f"sqlite:///{tmp_path / 'lapse.db'}"


# Columns migrations added after the previous layout: NULL in every upgraded row.
ADDED_SINCE = {ledger_transitions: {"event_topic", "event_partition", "event_offset"},  # 0008
               cleanup_ledger: {"traceparent"}}  # 0020


def legacy_tables() -> dict[Table, Table]:
    """Lapse's tables as the previous layout named them (default schema, old names), with the
    columns that layout had."""
    md = MetaData()
    tables = {}
    for table, old in LEGACY_NAMES.items():
        copy = table.to_metadata(md, schema=None, name=old)
        for name in ADDED_SINCE.get(table, ()):
            copy._columns.remove(copy.c[name])
        tables[table] = copy
    return tables


def read_as_before(conn, table: Table) -> list[dict]:
    """`table`'s rows with the columns of the previous layout; asserts the added ones are NULL."""
    rows = read_all(conn, table)
    added = ADDED_SINCE.get(table, set())
    assert all(row[name] is None for row in rows for name in added), table.name
    return [{k: v for k, v in row.items() if k not in added} for row in rows]


def seed_rows() -> dict[Table, list[dict]]:
    """Ledger rows in every state, their transitions, sent and unsent outbox rows, daily reports,
    and business rows; values of every column type, NULLs included."""
    states = ["pending", "claimed", "applied", "skipped", "retry_scheduled", "dead_letter"]
    ledger = [{"op_key": f"release-reservation:{i}", "kind": "release-reservation", "tenant": f"t{i % 3}",
               "subject_id": str(i), "state": states[i % len(states)], "attempt": i % 4,
               "due_at": T0 + timedelta(minutes=i), "claim_owner": "w1" if i % 6 == 1 else None,
               "claim_until": T0 + timedelta(hours=1) if i % 6 == 1 else None,
               "last_failure_class": "temporary" if i % 6 == 4 else None,
               "last_failure": "503 from the store" if i % 6 == 4 else None,
               "replay_id": None, "correlation_id": f"c{i}", "source": "sweep", "duplicates": i % 2,
               "created_at": T0, "updated_at": T0 + timedelta(seconds=i),
               "finished_at": T0 + timedelta(minutes=i, seconds=5) if i % 6 in (2, 3, 5) else None}
              for i in range(1, 61)]
    transitions = [{"op_key": f"release-reservation:{1 + n % 60}", "from_state": None if n % 2 else "pending",
                    "to_state": "pending" if n % 2 else "claimed", "attempt": 0, "failure_class": None,
                    "reason": None, "actor": "sweep", "replay_id": None, "correlation_id": f"c{n}",
                    "at": T0 + timedelta(seconds=n)} for n in range(1, 121)]
    outbox_rows = [{"topic": "lapse.outcomes", "key": f"release-reservation:{n}", "schema": "cleanup_outcome",
                    "payload": {"op_key": f"release-reservation:{n}", "state": "applied", "n": n},
                    "headers": {"lapse-correlation-id": f"c{n}"}, "created_at": T0,
                    "sent_at": T0 + timedelta(seconds=1) if n <= 25 else None} for n in range(1, 41)]
    reports = [{"report_key": f"daily-report:2026-11-0{d}", "report_date": date(2026, 11, d),
                "payload": {"applied": 10 * d}, "created_at": T0, "delivered_at": T0 if d == 1 else None,
                "attempts": d - 1, "last_error": None if d == 1 else "notifier down"} for d in (1, 2)]
    return {cleanup_ledger: ledger, ledger_transitions: transitions, outbox: outbox_rows, daily_reports: reports}


def business_rows() -> dict[Table, list[dict]]:
    return {reservations: [{"id": i, "tenant": "t0", "status": "held", "expires_at": T0, "released_at": None}
                           for i in (1, 2)],
            artifacts: [{"id": 1, "tenant": "t0", "object_key": "exports/1.csv", "status": "live",
                         "retain_until": T0, "deleted_at": None}]}


def read_all(conn, table: Table) -> list[dict]:
    return [dict(r) for r in conn.execute(select(table)).mappings()]


def by_key(table: Table, rows: list[dict]) -> dict[tuple, dict]:
    """Rows by primary key, to compare tables regardless of order."""
    return {tuple(r[c.name] for c in table.primary_key.columns): r for r in rows}


def test_upgrading_the_previous_head_keeps_every_row(empty_url):
    build_legacy_layout(empty_url)
    seeded, business = seed_rows(), business_rows()
    old = legacy_tables()
    engine = make_engine(empty_url)
    try:
        with engine.begin() as conn:
            for table, rows in seeded.items():
                conn.execute(insert(old[table]), rows)
            for table, rows in business.items():
                conn.execute(insert(table), rows)
        with engine.connect() as conn:  # ids as the old sequences gave them
            before = {table: read_all(conn, old[table]) for table in seeded} | {
                table: read_all(conn, table) for table in business}
    finally:
        engine.dispose()
    assert {t: len(rows) for t, rows in before.items()} == {t: len(rows) for t, rows in (seeded | business).items()}
    assert by_key(cleanup_ledger, before[cleanup_ledger]) == by_key(cleanup_ledger, seeded[cleanup_ledger])

    change = upgrade_url(empty_url)

    assert (change.before, change.after, change.legacy) == ("0003", HEAD, True)
    assert f"legacy 0003 → {HEAD}" in change.text()
    assert schema_diff(empty_url) == []
    engine = make_engine(empty_url)
    try:
        with engine.connect() as conn:
            for table, rows in before.items():
                assert by_key(table, read_as_before(conn, table)) == by_key(table, rows), table.name
        insp = inspect(engine)
        default_tables = set(insp.get_table_names(schema="public" if engine.dialect.name == "postgresql" else None))
        assert not default_tables & {"cleanup_ledger", "ledger_transitions", "outbox", "daily_reports",
                                     "alembic_version"}
        assert {"reservations", "artifacts"} <= default_tables
        if engine.dialect.name == "postgresql":
            assert {insp.get_pk_constraint(t.name, schema="lapse")["name"] for t in seeded} == {
                "pk_lapse_ledger", "pk_lapse_transitions", "pk_lapse_outbox", "pk_lapse_daily_reports"}
            with engine.connect() as conn:
                sequences = set(conn.exec_driver_sql(
                    "SELECT sequencename FROM pg_sequences WHERE schemaname = 'lapse'").scalars())
            assert sequences == {"lapse_transitions_id_seq", "lapse_outbox_id_seq", "lapse_operator_actions_id_seq",
                                 "lapse_budget_usage_id_seq"}

        # The sequences continue: new rows (through the batch insert, as the ledger writes them) get larger ids.
        with engine.begin() as conn:
            new_outbox = bulk_insert(conn, outbox, [{
                "topic": "lapse.outcomes", "key": "release-reservation:61", "schema": "cleanup_outcome",
                "payload": {"n": 61}, "headers": {}, "created_at": T0, "sent_at": None}], returning=["id"])
            new_transition = bulk_insert(conn, ledger_transitions, [{
                "op_key": "release-reservation:61", "from_state": None, "to_state": "pending", "attempt": 0,
                "actor": "sweep", "correlation_id": "c61", "at": T0}], returning=["id"])
        assert new_outbox[0].id > 40
        assert new_transition[0].id > 120
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(outbox)).scalar() == 41
    finally:
        engine.dispose()

    again = upgrade_url(empty_url)
    assert (again.before, again.after) == (HEAD, HEAD)
    assert f"{HEAD} (already at head)" in again.text()


def test_an_earlier_legacy_revision_is_refused_and_left_as_it_was(empty_url):
    build_legacy_layout(empty_url, "0002")

    with pytest.raises(UpgradeRefused, match="old revision 0002"):
        upgrade_url(empty_url)
    result = CliRunner().invoke(main, ["db", "upgrade", "--database-url", empty_url])

    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "old revision 0002" in result.output
    engine = make_engine(empty_url)
    try:
        insp = inspect(engine)
        assert not [t for t in insp.get_table_names() if t.startswith("lapse_")]
        if engine.dialect.name == "postgresql":
            assert not insp.has_schema("lapse")
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalars().all() == ["0002"]
    finally:
        engine.dispose()


def test_a_fresh_install_leaves_a_users_outbox_and_another_apps_alembic_version_alone(empty_url):
    users = MetaData()
    their_outbox = Table("outbox", users, Column("id", Integer, primary_key=True), Column("body", String(100)))
    their_versions = Table("alembic_version", users, Column("version_num", String(32), primary_key=True))
    secret = "not-a-password"
    if make_url(empty_url).get_backend_name() == "postgresql":  # the password in the URL, never printed
        secret = password_of(empty_url)
        empty_url = make_url(empty_url).set(password=secret).render_as_string(hide_password=False)
    engine = make_engine(empty_url)
    try:
        with engine.begin() as conn:
            users.create_all(conn)
            conn.execute(insert(their_outbox), [{"id": 7, "body": "their message"}])
            conn.execute(insert(their_versions), [{"version_num": "ae1027a6acf"}])
    finally:
        engine.dispose()

    # By variable: a password on the command line is refused (every user could read it in `ps`).
    first = CliRunner().invoke(main, ["db", "upgrade"], env={"LAPSE_DATABASE__URL": empty_url})
    second = CliRunner().invoke(main, ["db", "upgrade"], env={"LAPSE_DATABASE__URL": empty_url})

    assert first.exit_code == 0, first.output
    assert f"none → {HEAD}" in first.output
    assert f"{HEAD} (already at head)" in second.output
    assert secret not in first.output + second.output
    assert schema_diff(empty_url) == []
    engine = make_engine(empty_url)
    try:
        with engine.connect() as conn:
            assert read_all(conn, their_outbox) == [{"id": 7, "body": "their message"}]
            assert read_all(conn, their_versions) == [{"version_num": "ae1027a6acf"}]
        insp = inspect(engine)
        default = "public" if engine.dialect.name == "postgresql" else None
        assert [c["name"] for c in insp.get_columns("outbox", schema=default)] == ["id", "body"]
        assert not {"reservations", "artifacts"} & set(insp.get_table_names(schema=default))
    finally:
        engine.dispose()
