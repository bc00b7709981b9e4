"""Compose's database roles on the real PostgreSQL: compose/postgres/init-roles.sh run as the postgres
image's first start runs it, `lapse db upgrade` as lapse_migrate, then the db-grants service (the
same script's grants step, as the tables' owner). Each service's role may run what its code runs
and nothing else: a table of statements per role that PostgreSQL refuses (the audit trail rewritten
or truncated, the schema dropped, everything granted to PUBLIC, DDL or temporary tables, another
column of the ledger, the rotation functions misused), the statements of the paths the compose
workload (tests/system/test_compose_processes.py) does not reach run as their role (a console replay
and discard, the reconciler's re-emits, a report's delivery, a prune pass that rotates partitions),
and every table of the models is granted to some role, so a new table without grants fails here.

The roles carry a prefix of the test (roles are cluster-wide; the server is shared), made and
dropped by the cluster's owner (tests/fixtures/compose.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
from sqlalchemy import insert, select, text
from sqlalchemy.engine import make_url

from lapse.kernel.database import make_engine
from lapse.kernel.ledger import LedgerWrites, Selection, insert_pending, mark_stuck
from lapse.kernel.ledger import partitions as parts
from lapse.kernel.models import cleanup_ledger, ledger_transitions, metadata, operator_actions
from lapse.operator_actions import DISCARD, REPLAY, run_discard, run_replay
from lapse.reports import deliver_pending, enqueue_report
from lapse.reports.notifiers import FileNotifier
from lapse.retention import prune_once
from lapse.retention.horizons import horizons
from tests.fixtures.compose import DATABASE_SERVICES, ComposeDatabase
from tests.fixtures.fast_path import NOW, RELEASE, TENANT, key, release_event
from tests.fixtures.topology import repo_topology

DENIED, BAD_ARGUMENT = "42501", "22023"  # insufficient_privilege; the rotation functions' refusal
SERVICES = [s for s in DATABASE_SERVICES if s != "migrate"]
# What no service may do, whatever its work: rewrite or empty the audit trail, DDL, temporary tables,
# becoming the owner.
EVERY_SERVICE = [
    ("UPDATE lapse.lapse_transitions SET reason = 'rewritten'", DENIED),
    ("TRUNCATE lapse.lapse_transitions", DENIED),
    ("UPDATE lapse.lapse_operator_actions SET reason = 'rewritten'", DENIED),
    ("DELETE FROM lapse.lapse_operator_actions", DENIED),
    ("TRUNCATE lapse.lapse_operator_actions", DENIED),
    ("DROP SCHEMA lapse CASCADE", DENIED),
    ("CREATE TABLE lapse.intruder (id int)", DENIED),
    ("CREATE TABLE public.intruder (id int)", DENIED),
    ("CREATE TEMPORARY TABLE intruder (id int)", DENIED),
    ("ALTER TABLE lapse.lapse_ledger ADD COLUMN intruder int", DENIED),
    ("SET ROLE {migrate}", DENIED),
]
# What each service's grants leave out although it writes near it (the findings among them).
BY_SERVICE = [
    ("sweep", "UPDATE lapse.lapse_ledger SET state = 'applied'", DENIED),
    ("sweep", "DELETE FROM lapse.lapse_ledger", DENIED),
    ("sweep", "DELETE FROM lapse.lapse_transitions", DENIED),
    ("process", "DELETE FROM lapse.lapse_transitions", DENIED),
    ("process", "UPDATE lapse.lapse_ledger SET tenant = 'forged'", DENIED),
    ("process", "UPDATE lapse.lapse_ledger SET replay_id = 'forged'", DENIED),
    ("process", "INSERT INTO lapse.lapse_operator_actions (at, action, actor, reason, db_user, target, details) "
                "VALUES (now(), 'replay', 'x', 'x', 'x', 'x', '{}')", DENIED),
    ("relay", "UPDATE lapse.lapse_ledger SET state = 'applied'", DENIED),
    ("relay", "UPDATE lapse.lapse_outbox SET payload = '{}'", DENIED),
    ("relay", "DELETE FROM lapse.lapse_outbox", DENIED),
    ("relay", "INSERT INTO lapse.lapse_transitions (op_key, to_state, attempt, actor, at) "
              "VALUES ('k', 'applied', 1, 'x', now())", DENIED),
    # reconcile moves parked rows back to pending (the brakes' release): state, not the attempt.
    ("reconcile", "UPDATE lapse.lapse_ledger SET attempt = 0", DENIED),
    ("reconcile", "UPDATE lapse.lapse_ledger SET finished_at = now()", DENIED),
    ("reconcile", "DELETE FROM lapse.lapse_transitions", DENIED),
    ("reconcile", "DELETE FROM lapse.lapse_pauses", DENIED),
    ("process", "DELETE FROM lapse.lapse_pauses", DENIED),
    ("monitor", "INSERT INTO lapse.lapse_pauses (kind, tenant, cause, reason, actor, since, details) "
                "VALUES ('k', '', 'operator', 'x', 'x', now(), '{}')", DENIED),
    ("monitor", "UPDATE lapse.lapse_ledger SET state = 'applied'", DENIED),
    ("monitor", "DELETE FROM lapse.lapse_findings", DENIED),
    ("report", "UPDATE lapse.lapse_ledger SET state = 'discarded'", DENIED),
    ("report", "INSERT INTO lapse.lapse_transitions (op_key, to_state, attempt, actor, at) "
               "VALUES ('k', 'discarded', 1, 'x', now())", DENIED),
    ("console", "UPDATE lapse.lapse_ledger SET tenant = 'forged'", DENIED),
    ("console", "DELETE FROM lapse.lapse_ledger", DENIED),
    ("console", "DELETE FROM lapse.lapse_transitions", DENIED),
    ("prune", "UPDATE lapse.lapse_ledger SET state = 'applied'", DENIED),
    ("prune", "INSERT INTO lapse.lapse_transitions (op_key, to_state, attempt, actor, at) "
              "VALUES ('k', 'applied', 1, 'x', now())", DENIED),
    ("prune", "DROP TABLE lapse.lapse_transitions_default", DENIED),
    ("prune", "ALTER TABLE lapse.lapse_outbox DETACH PARTITION lapse.lapse_outbox_default", DENIED),
    ("prune", "SELECT lapse.lapse_drop_partition('lapse_transitions', 'lapse_transitions_default')", BAD_ARGUMENT),
    ("prune", "SELECT lapse.lapse_drop_partition('lapse_ledger', 'lapse_ledger')", BAD_ARGUMENT),
    ("prune", "SELECT lapse.lapse_drop_partition('lapse_outbox', 'lapse_transitions_default')", BAD_ARGUMENT),
    ("prune", "SELECT lapse.lapse_create_partition('lapse_outbox', '2031-01-01 05:00+00')", BAD_ARGUMENT),
    ("prune", "SELECT lapse.lapse_create_partition('lapse_transitions', '2031-01-01 00:00+00')", BAD_ARGUMENT),
    ("prune", "SELECT lapse.lapse_create_partition('lapse_ledger', '2031-01-01 00:00+00')", BAD_ARGUMENT),
    ("prune", "SELECT lapse.lapse_name_partition_indexes('lapse_outbox', 'lapse_outbox_default')", DENIED),
    *((s, "SELECT lapse.lapse_drop_partition('lapse_outbox', 'lapse_outbox_default')", DENIED)
      for s in SERVICES if s != "prune"),
]
# Refused with an error, or (on a table where the role holds some privilege without grant option) a
# warning that nothing was granted; either way PUBLIC holds nothing afterwards (checked).
GRANTS_NOTHING = [(s, statement) for s in SERVICES for statement in (
    "GRANT ALL ON ALL TABLES IN SCHEMA lapse TO PUBLIC", "GRANT ALL ON lapse.lapse_ledger TO PUBLIC")]


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _outcome(database: ComposeDatabase, service: str, statement: str) -> tuple[str | None, list[str]]:
    """The SQLSTATE `statement` failed with as `service`'s role (None: it ran), and the warnings."""
    notices: list[str] = []
    with psycopg.connect(_conninfo(database.service_url(service)), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        try:
            conn.execute(statement.replace("{migrate}", database.role("lapse_migrate")))  # type: ignore[arg-type]
        except psycopg.Error as exc:
            return exc.sqlstate, notices
    return None, notices


def test_each_role_is_refused_what_its_work_does_not_need(granted_compose_database):
    database = granted_compose_database
    table = [(s, statement, want) for s in SERVICES for statement, want in EVERY_SERVICE] + BY_SERVICE
    wrong = {}
    for service, statement, want in table:
        got, _ = _outcome(database, service, statement)
        if got != want:
            wrong[service, statement] = got
    for service, statement in GRANTS_NOTHING:
        got, notices = _outcome(database, service, statement)
        if got != DENIED and not any("no privileges were granted" in n for n in notices):
            wrong[service, statement] = got or notices
    assert not wrong, wrong
    owner = make_engine(database.service_url("migrate"))
    with owner.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM information_schema.role_table_grants "
                                 "WHERE grantee = 'PUBLIC' AND table_schema = 'lapse'")).scalar() == 0
        assert conn.execute(text("SELECT count(*) FROM lapse.lapse_ledger")).scalar() == 0  # nothing ran
    owner.dispose()


def test_the_owner_migrated_owns_every_table_and_each_is_granted_to_a_role(granted_compose_database):
    """`lapse db upgrade` ran as lapse_migrate (migration 0009's temporary table included); it owns
    every table and no service role inherits its rights (prune rotates through its functions); a
    table a migration adds needs its line per role in init-roles.sh: none is left to nobody."""
    database = granted_compose_database
    owner = make_engine(database.service_url("migrate"))
    roles = [database.role(f"lapse_{s}") for s in SERVICES]
    with owner.connect() as conn:
        owners = set(conn.execute(text("SELECT tableowner FROM pg_tables WHERE schemaname = 'lapse'")).scalars())
        members = conn.execute(text("SELECT r FROM unnest(CAST(:roles AS text[])) r "
                                    "WHERE pg_has_role(r, current_user, 'MEMBER')"), {"roles": roles}).scalars().all()
        granted = set(conn.execute(text(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'lapse' AND c.relkind IN ('r', 'p') AND EXISTS (SELECT 1 FROM unnest(CAST(:roles AS "
            "text[])) r WHERE has_any_column_privilege(r, c.oid, 'SELECT, INSERT, UPDATE'))"),
            {"roles": roles}).scalars())
    owner.dispose()
    assert owners == {database.role("lapse_migrate")} and members == []
    tables = {t.name for t in metadata.tables.values()}
    defaults = {s.default_name for s in (parts.TRANSITIONS, parts.OUTBOX)}
    assert tables | defaults <= granted, sorted(tables | defaults - granted)


def _dead_letters(owner, n: int) -> list[str]:
    keys = [key(RELEASE, i) for i in range(1, n + 1)]
    with owner.begin() as conn:
        conn.execute(insert(cleanup_ledger), [{
            "op_key": k, "kind": RELEASE, "tenant": TENANT, "subject_id": str(i), "state": "dead_letter",
            "attempt": 3, "due_at": NOW, "correlation_id": f"c{i}", "source": "sweep", "duplicates": 0,
            "created_at": NOW, "updated_at": NOW, "finished_at": NOW, "last_failure_class": "invalid",
            "last_failure": "bad"} for i, k in enumerate(keys, start=1)])
    return keys


def test_the_paths_the_workload_does_not_reach_run_as_their_role(granted_compose_database, tmp_path):
    """As console: a replay and a discard, each with its operator action; as reconcile: a missing
    row re-emitted and a stuck one marked; as report: a day's report stored and delivered; as prune:
    a pass 40 days ahead creates the partitions ahead (the owner's) and drops expired ones."""
    database = granted_compose_database
    owner = make_engine(database.service_url("migrate"))
    engines = {s: make_engine(database.service_url(s)) for s in ("console", "reconcile", "report", "prune")}
    try:
        first, second = _dead_letters(owner, 2)
        replayed = run_replay(engines["console"], Selection(op_keys=(first,)), limit=1, actor="ops", reason="fixed",
                              shown=1, expiry_topic=repo_topology().expiry)
        discarded = run_discard(engines["console"], Selection(op_keys=(second,)), limit=1, actor="ops",
                                reason="obsolete", shown=1)
        assert len(replayed["released"]) == 1 and len(discarded["discarded"]) == 1

        now = datetime.now(UTC)
        with engines["reconcile"].begin() as conn:
            event = release_event(99)
            assert insert_pending(conn, [event], now) == [event.op_key]
            stuck = mark_stuck(conn, "pending", now + timedelta(minutes=5), None, 10, now + timedelta(minutes=5))
            writes = LedgerWrites("reconciler", now)
            for row in stuck:
                writes.transition(row.op_key, "pending", "pending", row.attempt, reason="stuck")
            writes.flush(conn)
        assert {r.op_key for r in stuck} >= {first, event.op_key}

        day = (now - timedelta(days=1)).date()
        assert enqueue_report(engines["report"], day, now).key
        assert deliver_pending(engines["report"], FileNotifier(tmp_path / "reports"), now).delivered

        at = parts.OUTBOX.floor(now) + timedelta(days=40)
        retention = horizons(expiry_topic="expiry", expiry_retention_ms=str(14 * 86_400_000), dlq_topic="dlq",
                             dlq_retention_ms=str(30 * 86_400_000), grace_s=300.0, outbox_horizon_s=86_400.0)
        report = prune_once(engines["prune"], retention, at, batch_size=100)
        created = report.partitions["outbox"].create + report.partitions["transitions"].create
        assert created and report.partitions["outbox"].drop and report.partitions["transitions"].drop
        with owner.connect() as conn:
            owners = set(conn.execute(text("SELECT tableowner FROM pg_tables WHERE tablename = ANY(:names)"),
                                      {"names": created}).scalars())
            actions = conn.execute(select(operator_actions.c.action, operator_actions.c.db_user)).all()
            transitions = conn.execute(select(ledger_transitions.c.to_state)).scalars().all()
        assert owners == {database.role("lapse_migrate")}
        assert sorted(actions) == [(DISCARD, database.role("lapse_console")), (REPLAY, database.role("lapse_console"))]
        assert transitions == []  # a pass 40 days ahead dropped every partition they were in
    finally:
        for engine in (owner, *engines.values()):
            engine.dispose()

