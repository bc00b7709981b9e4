"""Retention on a 2,000,000-row ledger (PostgreSQL): every prune statement, at the real batch size,
and every statement `lapse status` counts the ledger with reads an index, never a whole table
(EXPLAIN ANALYZE shows no Seq Scan on the ledger, transitions or outbox), and a batch removes what it
should.

The tables are filled by generate_series in SQL, op keys in primary-key order, with the secondary
indexes dropped and rebuilt after the load, and set UNLOGGED (a throwaway database; plans do not
depend on it). The test prints how long the seed and the checks took; no assertion on time."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event, text

from lapse.kernel.database import make_engine
from lapse.kernel.ledger import count_prunable, prune_dead_letters, prune_outbox, prune_settled, prune_transitions
from lapse.readers.status import ledger_status
from lapse.reconciler.horizons import horizons

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
OUTBOX = """
INSERT INTO lapse.lapse_outbox (topic, key, schema, payload, headers, created_at, sent_at)
SELECT 'o', 'k:' || lpad(i::text, 7, '0'), 'cleanup_outcome', '{}', '{}', :now - (i % 259200) * interval '1 second',
       CASE WHEN i % 100 = 0 THEN NULL ELSE :now - (i % 259200) * interval '1 second' END
FROM generate_series(1, :outbox) AS i
"""


def load(engine) -> None:
    """The three tables filled, their secondary indexes rebuilt afterwards from their own
    definitions (several times faster than maintaining them row by row), then analyzed."""
    params = {"now": NOW, "rows": ROWS, "every": TRANSITIONS_EVERY, "outbox": OUTBOX_ROWS}
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL maintenance_work_mem = '256MB'"))
        indexes = conn.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'lapse' AND tablename = ANY(:tables) "
            "AND indexname NOT LIKE 'pk\\_%'"), {"tables": list(TABLES)}).all()
        for table in TABLES:
            conn.execute(text(f"ALTER TABLE lapse.{table} SET UNLOGGED"))
        for name, _ in indexes:
            conn.execute(text(f'DROP INDEX lapse."{name}"'))
        for statement in (LEDGER, TRANSITIONS, OUTBOX):
            conn.execute(text(statement), params)
        for _, definition in indexes:
            conn.execute(text(definition))
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


def assert_no_table_scan(plan: str) -> None:
    for table in TABLES:
        assert f"Seq Scan on {table}" not in plan, plan


@pytest.mark.scale
@pytest.mark.slow
def test_prune_and_status_read_indexes_on_a_two_million_row_ledger(pg_url):
    engine = make_engine(pg_url, statement_timeout_s=None)
    started = time.monotonic()
    load(engine)
    seeded_s = time.monotonic() - started
    settled, dead, outbox = (h.cutoff(NOW) for h in (HORIZONS.settled, HORIZONS.dead_letters, HORIZONS.outbox))
    assert settled is not None and dead is not None and outbox is not None
    removed: dict[str, int] = {}

    def one_batch_each(conn) -> None:
        removed["settled"] = prune_settled(conn, settled, BATCH)
        removed["dead"] = prune_dead_letters(conn, dead, BATCH)
        removed["transitions"], _ = prune_transitions(conn, settled, None, BATCH)
        removed["outbox"] = prune_outbox(conn, outbox, BATCH)

    prunes = recorded(engine, one_batch_each)
    # Full batches where a table has more than one batch past its horizon (the 2,000 dead letters do not).
    assert removed == {"settled": BATCH, "dead": removed["dead"], "transitions": BATCH, "outbox": BATCH}
    assert 0 < removed["dead"] < BATCH
    # The dead letters' batch is not full, so the discarded ones (none here) are looked for too:
    # through their discard transitions.
    indexes = ["ix_lapse_ledger_settled_finished", "ix_lapse_ledger_dead_letters", "ix_lapse_transitions_at",
               "ix_lapse_transitions_at", "ix_lapse_outbox_sent"]
    assert len(prunes) == len(indexes)
    for (statement, parameters), index in zip(prunes, indexes, strict=True):
        plan = explain(engine, statement, parameters)
        assert_no_table_scan(plan)
        assert index in plan, plan
    for walk in (prunes[2], prunes[3]):  # each candidate's ledger row, by key
        assert "pk_lapse_ledger" in explain(engine, *walk)

    counts: dict[str, int] = {}
    dry = recorded(engine, lambda conn: counts.update(count_prunable(
        conn, settled_cutoff=settled, dead_letter_cutoff=dead, transitions_cutoff=settled, outbox_cutoff=outbox)))
    status = recorded(engine, lambda conn: ledger_status(conn, NOW))
    # The dry run's exact counts are on demand, not periodic: a count of half a grown ledger may
    # rightly read the table. Only their results are checked here.
    assert len(dry) == 5  # the dead letters' count is two: dead letters, and discarded ones
    for statement, parameters in status:
        if any(table in statement for table in TABLES):
            with engine.connect() as conn:
                plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
            assert_no_table_scan(plan)
    # Row i finished i seconds ago (mod 28 days): those older than the horizon, less the 0.4% unfinished.
    assert counts["ledger_settled"] == pytest.approx((ROWS - 14 * 86_400 - 300) * 0.996, rel=0.01)
    assert counts["ledger_dead_letters"] == removed["dead"]
    # Row i sent i seconds ago (mod 3 days), one in a hundred unsent: those sent more than a day ago.
    assert counts["outbox"] == pytest.approx((259_200 - 86_400) * 0.99, rel=0.01)
    print(f"seeded in {seeded_s:.1f}s, checked in {time.monotonic() - started - seeded_s:.1f}s")
    engine.dispose()
