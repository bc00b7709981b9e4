"""One worker on an empty ledger and on a 10,000,000-row one (3,000,000 transitions and outbox rows
in their time partitions), on Apache Kafka and PostgreSQL: every statement a batch sends is planned
along indexes at both sizes (EXPLAIN of the very statements, with their parameters, captured while
a batch ran), and the worker's rate at each size is printed for docs/performance.md (the issue's
target: the big ledger at least 0.9 of the empty one; speed is measured, never asserted).

The history is seeded by generate_series in SQL, finished rows of other subjects, as retention
would leave them, and the business table holds 200,000 rows of other subjects from the start; then
VACUUM ANALYZE, as autovacuum would have by then."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event as sa_event
from sqlalchemy import func, select, text

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_kinds import load_demo_kinds
from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine, qualified_name
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.processors import BatchScope, apply_batch
from tests.fixtures.pipeline import PAST, Pipeline, expiry_event, make_pipeline_settings, produce
from tests.fixtures.polling import eventually
from tests.fixtures.workers import running_workers

LEDGER_ROWS, HISTORY_ROWS, EVENTS, BATCH = 10_000_000, 3_000_000, 20_000, 500
BUSINESS_ROWS = 200_000
DRAINS = 2  # the best of two drains at each size: one minute of a busy machine moves one by more
RELEASE = "release-reservation"
# The tables no batch statement may read whole (the business table is the demo's reservations).
WATCHED = {"lapse_ledger", "lapse_transitions", "lapse_outbox", "reservations"}

SEED_LEDGER = """
INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at, correlation_id, source,
                      duplicates, created_at, updated_at, finished_at)
SELECT 'release-reservation:' || (g + 100000000), 'release-reservation', 'tenant-' || (g % 7),
       (g + 100000000)::text, 'applied', 1, now() - interval '1 day', md5(g::text), 'sweep', 0,
       now() - interval '1 day', now() - interval '1 day', now() - interval '1 day'
FROM generate_series(1, :rows) g
"""
# The business table is not a toy either: paid reservations of other subjects, before anything runs.
SEED_BUSINESS = """
INSERT INTO reservations (tenant, status, expires_at)
SELECT 'tenant-' || (g % 7), 'paid', now() - interval '1 day' FROM generate_series(1, :rows) g
"""
SEED_TRANSITIONS = """
INSERT INTO {transitions} (op_key, from_state, to_state, attempt, actor, correlation_id, at)
SELECT 'release-reservation:' || (g + 100000000), 'pending', 'applied', 1, 'seed', md5(g::text),
       now() - (g % 3600) * interval '1 second'
FROM generate_series(1, :rows) g
"""
SEED_OUTBOX = """
INSERT INTO {outbox} (topic, key, schema, payload, headers, created_at, sent_at)
SELECT 'seed', 'release-reservation:' || (g + 100000000), 'cleanup_outcome', '{{"status": "applied"}}', '{{}}',
       now() - (g % 3600) * interval '1 second', now()
FROM generate_series(1, :rows) g
"""


def _drain(p: Pipeline) -> float:
    """Produce EVENTS events for fresh held reservations, run one worker until they are applied;
    events/s from the first of their ledger rows to the last seen applied."""
    with p.engine.begin() as conn:
        ids = add_reservations(conn, EVENTS, expires_at=PAST - timedelta(minutes=1), tenant="t1")
    start = datetime.now(UTC)
    produce(p, [expiry_event(i) for i in ids])

    def done() -> bool:  # along the settled rows' finish-time index: cheap on the big ledger too
        with p.engine.connect() as conn:
            return conn.execute(select(func.count()).where(cleanup_ledger.c.state == "applied",
                                                           cleanup_ledger.c.finished_at >= start)).scalar() == EVENTS

    with running_workers(p.settings):
        eventually(done, timeout_s=600, interval_s=0.05, what=f"{EVENTS} events applied")
        seen = datetime.now(UTC)
    with p.engine.connect() as conn:
        first = conn.execute(select(func.min(cleanup_ledger.c.created_at))
                             .where(cleanup_ledger.c.state == "applied", cleanup_ledger.c.finished_at >= start)
                             ).scalar_one()
    return EVENTS / (seen - first).total_seconds()


def _plans(p: Pipeline) -> dict[str, list[str]]:
    """One batch of BATCH due first deliveries through apply_batch, its statements captured with
    their parameters and EXPLAINed afterwards: statement (its first words) → the sequential scans
    of WATCHED tables in its plan."""
    with p.engine.begin() as conn:
        ids = add_reservations(conn, BATCH, expires_at=PAST - timedelta(minutes=1), tenant="t1")
    kinds = load_demo_kinds(p.engine)
    seen: list[tuple[str, Any]] = []

    def capture(_conn, _cursor, statement, parameters, _context, _executemany):
        seen.append((statement, parameters))

    events = [expiry_event(i) for i in ids]
    with p.engine.connect() as conn:
        sa_event.listen(conn, "before_cursor_execute", capture)
        with conn.begin() as trans:
            scope = BatchScope(conn, kinds=kinds, topics=p.settings.topology, worker="w", now=datetime.now(UTC),
                               lease=timedelta(seconds=30))
            assert len(apply_batch(scope.begun(), events).applied) == BATCH
            found = {}
            driver = conn.connection.driver_connection
            for statement, parameters in seen:
                if not statement.lstrip().upper().startswith(("SELECT", "WITH", "INSERT", "UPDATE", "DELETE")):
                    continue
                with driver.cursor() as cur:  # the statement as sent, planned with its own values
                    cur.execute("EXPLAIN (FORMAT JSON) " + statement, parameters)
                    plan = cur.fetchone()[0]
                found[" ".join(statement.split()[:6])] = _seq_scans(plan)
            trans.rollback()
    return found


def _seq_scans(plan: Any) -> list[str]:
    if isinstance(plan, list):
        return [s for item in plan for s in _seq_scans(item)]
    if not isinstance(plan, dict):
        return []
    own = [plan["Relation Name"]] if plan.get("Node Type") == "Seq Scan" and any(
        plan.get("Relation Name", "").startswith(t) for t in WATCHED) else []
    return own + [s for child in plan.get("Plans", []) + ([plan["Plan"]] if "Plan" in plan else [])
                  for s in _seq_scans(child)]


@pytest.mark.scale
@pytest.mark.slow
def test_one_worker_on_ten_million_ledger_rows(kafka_bootstrap, pg_url, unique):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, expiry_partitions=4,
                                      processor={"batch_size": BATCH}, runtime={"log_level": "WARNING"})
    p = Pipeline(settings, make_engine(pg_url), Codec.from_settings(settings))
    seeder = make_engine(pg_url, statement_timeout_s=None)
    try:
        with seeder.begin() as conn:
            conn.execute(text(SEED_BUSINESS), {"rows": BUSINESS_ROWS})
        with seeder.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE reservations")
        empty_plans = _plans(p)
        empty_rate = max(_drain(p) for _ in range(DRAINS))
        started = time.monotonic()
        names = {"ledger": qualified_name(seeder, cleanup_ledger),
                 "transitions": qualified_name(seeder, ledger_transitions), "outbox": qualified_name(seeder, outbox)}
        with seeder.begin() as conn:
            conn.execute(text(SEED_LEDGER.format(**names)), {"rows": LEDGER_ROWS})
            conn.execute(text(SEED_TRANSITIONS.format(**names)), {"rows": HISTORY_ROWS})
            conn.execute(text(SEED_OUTBOX.format(**names)), {"rows": HISTORY_ROWS})
        with seeder.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in names.values():
                conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
        seeded = time.monotonic() - started
        big_plans = _plans(p)
        big_rate = max(_drain(p) for _ in range(DRAINS))
    finally:
        p.engine.dispose()
        seeder.dispose()
    print(json.dumps({"seeded_s": round(seeded), "empty_events_per_s": round(empty_rate),
                      "big_events_per_s": round(big_rate), "big_vs_empty": round(big_rate / empty_rate, 2),
                      "statements": sorted(empty_plans)}, indent=2))
    assert {s: scans for s, scans in empty_plans.items() if scans} == {}
    assert {s: scans for s, scans in big_plans.items() if scans} == {}
