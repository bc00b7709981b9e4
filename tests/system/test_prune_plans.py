"""Retention on a 2,000,000-row ledger (PostgreSQL): every prune statement, at the real batch size,
and every statement `lapse status` counts the ledger with reads an index, never a whole table
(EXPLAIN ANALYZE shows no Seq Scan on the ledger, transitions or outbox, or any of their
partitions), and a batch removes what it should.

Transitions and the outbox are time-partitioned (migration 0009): the partitions covering the
seeded range are created first (as `lapse prune` creates them ahead, day by day), and each DEFAULT
partition gets 20,000 old rows of its own. Checked besides: the per-partition probes that decide a
drop (an outbox day's unsent rows and newest send) read its indexes; the relay's statements (take
the oldest unsent rows, all or by slot; mark them sent, naming their created_at range) and the
history reads (an operation's timeline, a dead letter's failures, a correlation id's window, the
daily report's day) read indexes and only the partitions their time range names; a pass rotates the
partitions (drops the weeks of transitions past a 14-day history horizon, the outbox days past a day,
keeps the day holding an unsent row), each drop a metadata change that takes milliseconds.

The tables are filled by generate_series in SQL, op keys in primary-key order, with the secondary
indexes dropped and rebuilt after the load, and set UNLOGGED (a throwaway database; plans do not
depend on it). The test prints how long the seed and the checks took; no assertion on time."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text

from lapse.kernel.database import make_engine
from lapse.kernel.ledger import failure_history, transitions_between
from lapse.kernel.ledger import partitions as parts
from lapse.producers.relay_queries import lock_unsent, mark_sent
from lapse.readers.history_queries import correlation_statement, ledger_record, outbox_of, transitions_of
from lapse.readers.status import ledger_status
from lapse.retention import partitions as rotation
from lapse.retention import prune_dry_run, prune_once
from lapse.retention.horizons import Horizon, Horizons, horizons
from lapse.retention.queries import count_prunable, prune_dead_letters, prune_history, prune_outbox, prune_settled

ROWS = 2_000_000
TRANSITIONS_EVERY = 2  # a transition for every other ledger row: 1,000,000
OUTBOX_ROWS = 300_000
BATCH = 5000
NOW = datetime.now(UTC).replace(microsecond=0)
HORIZONS = horizons(expiry_topic="expiry", expiry_retention_ms=str(14 * 86_400_000), dlq_topic="dlq",
                    dlq_retention_ms=str(90 * 86_400_000), grace_s=300.0, outbox_horizon_s=86_400.0)
TABLES = ("lapse_ledger", "lapse_transitions", "lapse_outbox")

# i % 1000 in 0..2: an unfinished state, 3: dead_letter; i % 10 = 5: skipped; the rest applied.
# Finished rows over the last 28 days (half past the 14-day horizon), dead letters 80 to 108 days ago.
LEDGER = """
INSERT INTO lapse.lapse_ledger (op_key, kind, tenant, subject_id, state, attempt, due_at, claim_owner,
    claim_until, correlation_id, source, duplicates, created_at, updated_at, finished_at)
SELECT 'k:' || lpad(i::text, 7, '0'), 'release-reservation', 't1', lpad(i::text, 7, '0'), s, 1, f,
       CASE WHEN s = 'claimed' THEN 'w' END,
       CASE WHEN s = 'claimed' THEN :now - interval '1 minute' END, 'c', 'sweep', 0, f, f,
       CASE WHEN s IN ('applied', 'skipped', 'dead_letter') THEN f END
FROM (SELECT i, s, CASE WHEN s = 'dead_letter' THEN :now - interval '80 days' ELSE :now END
                   - (i % 2419200) * interval '1 second' AS f
      FROM (SELECT i, CASE i % 1000 WHEN 0 THEN 'pending' WHEN 1 THEN 'claimed' WHEN 2 THEN 'retry_scheduled'
                                    WHEN 3 THEN 'dead_letter'
                                    ELSE CASE WHEN i % 10 = 5 THEN 'skipped' ELSE 'applied' END END AS s
            FROM generate_series(1, :rows) AS i) AS g) AS h
"""
# One transition per TRANSITIONS_EVERY-th op key, at its row's finish (or creation) time; a tenth of
# them of op keys with no ledger row any more (removed before: the ones prune takes).
TRANSITIONS = """
INSERT INTO lapse.lapse_transitions (op_key, from_state, to_state, attempt, actor, at)
SELECT CASE WHEN i % 10 = 0 THEN 'gone:' ELSE 'k:' END || lpad(i::text, 7, '0'), 'pending', 'applied', 1, 'w',
       :now - (i % 2419200) * interval '1 second'
FROM generate_series(:every, :rows, :every) AS i
"""
# Sent as they were created, but one in a hundred of the last day unsent (the relay's backlog), and
# one row three days old (it pins its day's partition).
OUTBOX = """
INSERT INTO lapse.lapse_outbox (topic, key, schema, payload, headers, created_at, sent_at)
SELECT 'o', 'k:' || lpad(i::text, 7, '0'), 'cleanup_outcome', '{}', '{}', :now - (i % 259200) * interval '1 second',
       CASE WHEN (i % 100 = 0 AND i % 259200 < 86400) OR i = 259199 THEN NULL
            ELSE :now - (i % 259200) * interval '1 second' END
FROM generate_series(1, :outbox) AS i
"""
# Rows older than any partition: each DEFAULT partition's share (sent, or of op keys long gone).
DEFAULTS = """
INSERT INTO lapse.lapse_outbox (topic, key, schema, payload, headers, created_at, sent_at)
SELECT 'o', 'old:' || i, 'cleanup_outcome', '{}', '{}', :now - interval '60 days' - i * interval '1 second',
       :now - interval '60 days' - i * interval '1 second'
FROM generate_series(1, :defaults) AS i;
INSERT INTO lapse.lapse_transitions (op_key, from_state, to_state, attempt, actor, at)
SELECT 'old:' || i, 'pending', 'applied', 1, 'w', :now - interval '120 days' - i * interval '1 second'
FROM generate_series(1, :defaults) AS i
"""
DEFAULT_ROWS = 20_000
# The seeded range of each partitioned table: its partitions are created before the load.
SEEDED_DAYS = {parts.TRANSITIONS: 28, parts.OUTBOX: 3}
SCHEMES = (parts.TRANSITIONS, parts.OUTBOX)


def create_partitions(engine) -> None:
    """The partitions of the seeded range, from its oldest unit to today's (the migration made
    those from today on)."""
    for scheme, days in SEEDED_DAYS.items():
        with engine.connect() as conn:
            existing = parts.partitions(conn, scheme)
        lower = scheme.floor(NOW - timedelta(days=days))
        while lower <= NOW:
            if not any(p.lower == lower for p in existing):
                with engine.begin() as conn:
                    rotation.create_partition(conn, scheme, lower)
            lower += scheme.unit


def load(engine) -> None:
    """The three tables filled, their secondary indexes rebuilt afterwards from their own
    definitions (several times faster than maintaining them row by row; a partitioned table's
    index, dropped, takes its partitions' with it, and re-created builds them again, named after
    their partition as `lapse prune` names them), then analyzed."""
    params = {"now": NOW, "rows": ROWS, "every": TRANSITIONS_EVERY, "outbox": OUTBOX_ROWS, "defaults": DEFAULT_ROWS}
    create_partitions(engine)
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL maintenance_work_mem = '256MB'"))
        indexes = conn.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'lapse' AND tablename = ANY(:tables) "
            "AND indexname NOT LIKE 'pk\\_%'"), {"tables": list(TABLES)}).all()
        leaves = conn.execute(text(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'lapse' AND c.relkind = 'r' AND (c.relname = ANY(:tables) OR c.relispartition)"),
            {"tables": list(TABLES)}).scalars().all()
        for table in leaves:  # a partitioned table has no storage of its own: its partitions do
            conn.execute(text(f'ALTER TABLE lapse."{table}" SET UNLOGGED'))
        for name, _ in indexes:
            conn.execute(text(f'DROP INDEX lapse."{name}"'))
        for statement in (LEDGER, TRANSITIONS, OUTBOX, *DEFAULTS.split(";")):
            conn.execute(text(statement), params)
        for _, definition in indexes:
            conn.execute(text(definition.replace(" ON ONLY ", " ON ")))
        for scheme in SCHEMES:
            for p in parts.partitions(conn, scheme):
                conn.execute(text("SELECT lapse.lapse_name_partition_indexes(:table, :partition)"),
                             {"table": scheme.name, "partition": p.name})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in TABLES:
            conn.execute(text(f"ANALYZE lapse.{table}"))


def recorded(engine, work) -> list[tuple[str, Any]]:
    """The statements `work(conn)` executes, in a transaction rolled back afterwards."""
    statements: list[tuple[str, Any]] = []

    def record(_conn, _cursor, statement, parameters, _context, _many):
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", record)
    try:
        with engine.connect() as conn:
            work(conn)
            conn.rollback()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    return statements


def explain(engine, statement: str, parameters: Any) -> str:
    """EXPLAIN ANALYZE of `statement` (a DELETE runs, in a transaction rolled back)."""
    with engine.connect() as conn:
        plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN ANALYZE " + statement, parameters))
        conn.rollback()
    return plan


def assert_no_table_scan(plan: str, tables: tuple[str, ...] = TABLES) -> None:
    """No Seq Scan on the tables, nor on any partition of theirs (named after them), but of an empty
    partition (one created ahead: no pages, cost 0.00, it reads nothing; once rows arrive the
    planner sees its real size)."""
    for line in plan.splitlines():
        if "Seq Scan on " in line and "cost=0.00..0.00 " not in line:
            assert not any(f"Seq Scan on {table}" in line for table in tables), plan


def partitions_read(plan: str) -> set[str]:
    """The partitions a plan reads (its scan nodes' relations)."""
    return set(re.findall(r" on (lapse_(?:transitions|outbox)_(?:p\d{8}|default))\b", plan))


def plan_of(engine, statement: str, parameters: Any, *settings: str) -> str:
    """EXPLAIN (no ANALYZE) of `statement`, after `settings` (SET LOCAL … as the caller's transaction has them)."""
    with engine.connect() as conn:
        for setting in settings:
            conn.exec_driver_sql(setting)
        plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
        conn.rollback()
    return plan


def check_prunes(engine, settled, dead, outbox) -> None:
    """One batch of each prune statement: full batches where a table has more than one batch past
    its horizon, each through its index."""
    removed: dict[str, int] = {}
    defaults = {s: s.default_table() for s in SCHEMES}

    def one_batch_each(conn) -> None:
        removed["settled"] = prune_settled(conn, settled, BATCH)
        removed["dead"] = prune_dead_letters(conn, dead, BATCH)
        # Transitions and sent outbox rows go with their partitions; DEFAULT's old rows in batches.
        removed["history"] = prune_history(conn, defaults[parts.TRANSITIONS], settled, BATCH)
        removed["outbox"] = prune_outbox(conn, outbox, BATCH, defaults[parts.OUTBOX])

    prunes = recorded(engine, one_batch_each)
    assert removed == {"settled": BATCH, "dead": removed["dead"], "history": BATCH, "outbox": BATCH}
    assert 0 < removed["dead"] < BATCH  # the 2,000 dead letters are one short batch
    # The dead letters' batch is not full, so the discarded ones (none here) are looked for too:
    # through their discard transitions, in the partitions before the cutoff (DEFAULT alone here).
    indexes = ["ix_lapse_ledger_settled_finished", "ix_lapse_ledger_dead_letters", "ix_lapse_transitions_at_",
               "ix_lapse_transitions_at_default", "ix_lapse_outbox_sent_default"]
    assert len(prunes) == len(indexes)
    for (statement, parameters), index in zip(prunes, indexes, strict=True):
        plan = explain(engine, statement, parameters)
        assert_no_table_scan(plan)
        assert index in plan, plan
    assert "pk_lapse_ledger" in explain(engine, *prunes[2])  # each discard's ledger row, by key
    # The DEFAULT partitions' batches read DEFAULT alone.
    assert partitions_read(explain(engine, *prunes[3])) == {"lapse_transitions_default"}
    assert partitions_read(explain(engine, *prunes[4])) == {"lapse_outbox_default"}


def check_relay_and_history(engine) -> None:
    """The relay's statements and the history reads: indexes only, and only the partitions their
    time range names."""
    taken: list[Any] = []

    def relay(conn) -> None:
        taken.extend(lock_unsent(conn, 500))
        lock_unsent(conn, 500, list(range(0, 64, 2)))  # half the slots, as one of two relays
        created = [r.created_at for r in taken]
        mark_sent(conn, [r.id for r in taken], NOW, (min(created), max(created)))

    statements = recorded(engine, relay)
    locks = [(s, p) for s, p in statements if "FOR UPDATE" in s]
    marks = [(s, p) for s, p in statements if s.startswith("UPDATE")]
    assert len(locks) == 2 and len(marks) == 1
    for (statement, parameters), settings in zip(locks, [(), ("SET LOCAL enable_sort = off",)], strict=True):
        plan = plan_of(engine, statement, parameters, *settings)
        assert_no_table_scan(plan)
        assert "ix_lapse_outbox_unsent_p" in plan, plan
    # The 500 oldest unsent rows by id were created in the last 14 hours: marking them sent reads
    # their day's partition (two across midnight), by primary key, not the other eleven.
    mark_plan = explain(engine, *marks[0])
    assert_no_table_scan(mark_plan)
    assert "pk_lapse_outbox_p" in mark_plan, mark_plan
    assert 1 <= len(partitions_read(mark_plan)) <= 2, mark_plan
    print(f"mark sent reads {sorted(partitions_read(mark_plan))}")

    day = parts.OUTBOX.floor(NOW) - timedelta(days=3)
    recent = "k:0000010"  # finished 10 s before NOW, with a transition

    with engine.connect() as conn:
        row = ledger_record(conn, recent)
    assert row is not None
    # (reads, index, at most this many transitions partitions read: None, every one, by index)
    reads = [
        (lambda conn: transitions_of(conn, row), "ix_lapse_transitions_failures_p", None),  # `lapse show`
        (lambda conn: outbox_of(conn, row), "ix_lapse_outbox_", None),
        (lambda conn: failure_history(conn, [recent, "k:0000012"]), "ix_lapse_transitions_failures_p", None),
        (lambda conn: conn.execute(correlation_statement("c", NOW - timedelta(hours=1), NOW, 100)).all(),
         "ix_lapse_transitions_at_p", 1),
    ]
    for read, index, most in reads:
        for statement, parameters in recorded(engine, read):
            plan = explain(engine, statement, parameters)
            assert_no_table_scan(plan)
            assert index in plan, plan
            if most is not None:  # a time range: its partition, and DEFAULT (whose range is all the rest)
                assert len([p for p in partitions_read(plan) if "transitions_p" in p]) <= most, plan
    # The daily report's day: its transitions through the index of that day's partition alone. (Its
    # join to the ledger for the kind hashes the ledger, a scan of it once a day: not retention's.)
    for statement, parameters in recorded(engine, lambda conn: transitions_between(conn, day, day + timedelta(days=1))):
        plan = explain(engine, statement, parameters)
        assert_no_table_scan(plan, ("lapse_transitions",))
        assert "ix_lapse_transitions_at_p" in plan, plan
        assert len([p for p in partitions_read(plan) if "transitions_p" in p]) == 1, plan


def check_rotation(engine) -> None:
    """A pass with a 14-day history horizon (the least it may be) drops the weeks of transitions
    wholly before it and the outbox days past a day, but the day with an unsent row; the probes
    that decide it read indexes."""
    history_s = 14 * 86_400 + 300.0
    rotating = Horizons(settled=Horizon(None, "kept (not under test)"), dead_letters=Horizon(None, "kept"),
                        outbox=HORIZONS.outbox, history=Horizon(history_s, "14d 5m"))
    outbox_cutoff = HORIZONS.outbox.cutoff(NOW)
    assert outbox_cutoff is not None
    with engine.connect() as conn:
        expired_days = rotation.expired(parts.partitions(conn, parts.OUTBOX), outbox_cutoff)
        expired_weeks = rotation.expired(parts.partitions(conn, parts.TRANSITIONS), NOW - timedelta(seconds=history_s))
    assert len(expired_days) == 2 and expired_weeks
    probes = recorded(engine, lambda conn: [rotation.outbox_pin(conn, p, outbox_cutoff) for p in expired_days])
    for statement, parameters in probes:
        plan = explain(engine, statement, parameters)
        assert_no_table_scan(plan)
        assert re.search(r"ix_lapse_outbox_(unsent|sent)_p\d{8}", plan), plan

    dry = prune_dry_run(engine, rotating, NOW)
    started = time.monotonic()
    done = prune_once(engine, rotating, NOW, BATCH)
    took = time.monotonic() - started
    for report in (dry, done):
        outbox_work, transitions_work = report.partitions["outbox"], report.partitions["transitions"]
        assert [p["name"] for p in outbox_work.pinned] == [expired_days[0].name]  # the unsent row's day
        assert [p["name"] for p in outbox_work.drop] == [expired_days[1].name]
        assert [p["name"] for p in transitions_work.drop] == [p.name for p in expired_weeks]
    dropped_rows = sum(p["rows_estimate"] for w in done.partitions.values() for p in w.drop)
    assert dropped_rows > 100_000
    # DEFAULT's old transitions (120 days) went in batches; its outbox rows (sent 60 days ago) too.
    assert done.removed["transitions"] == DEFAULT_ROWS and done.removed["outbox"] == DEFAULT_ROWS
    with engine.connect() as conn:
        left = {s.name: [p.name for p in parts.partitions(conn, s)] for s in SCHEMES}
    assert not {p.name for p in expired_weeks} & set(left["lapse_transitions"])
    assert expired_days[0].name in left["lapse_outbox"] and expired_days[1].name not in left["lapse_outbox"]
    print(f"rotation: {len(done.partitions['transitions'].drop) + 1} partitions dropped "
          f"(~{dropped_rows} rows) and {2 * DEFAULT_ROWS} DEFAULT rows deleted in {took:.2f}s")


@pytest.mark.scale
@pytest.mark.slow
def test_prune_and_status_read_indexes_on_a_two_million_row_ledger(pg_url):
    engine = make_engine(pg_url, statement_timeout_s=None)
    started = time.monotonic()
    load(engine)
    seeded_s = time.monotonic() - started
    settled, dead, outbox = (h.cutoff(NOW) for h in (HORIZONS.settled, HORIZONS.dead_letters, HORIZONS.outbox))
    assert settled is not None and dead is not None and outbox is not None

    check_prunes(engine, settled, dead, outbox)

    counts: dict[str, int] = {}
    dry = recorded(engine, lambda conn: counts.update(count_prunable(
        conn, settled_cutoff=settled, dead_letter_cutoff=dead, transitions_cutoff=None, outbox_cutoff=None)))
    status = recorded(engine, lambda conn: ledger_status(conn, NOW))
    # The dry run's exact counts are on demand, not periodic: a count of half a grown ledger may
    # rightly read the table. Only their results are checked here.
    assert len(dry) == 3  # the dead letters' count is two: dead letters, and discarded ones
    for statement, parameters in status:
        if any(table in statement for table in TABLES):
            with engine.connect() as conn:
                plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert_no_table_scan(plan)
    # Row i finished i seconds ago (mod 28 days): those older than the horizon, less the 0.4% unfinished.
    assert counts["ledger_settled"] == pytest.approx((ROWS - 14 * 86_400 - 300) * 0.996, rel=0.01)

    check_relay_and_history(engine)
    check_rotation(engine)
    print(f"seeded in {seeded_s:.1f}s, checked in {time.monotonic() - started - seeded_s:.1f}s")
    engine.dispose()
