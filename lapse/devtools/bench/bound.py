"""The database's lower bound for exactly Lapse's writes per event, on Lapse's schema and indexes:
one ledger row (already applied), one transition, one outcome in the outbox and the business
update, one transaction per batch. Each batch goes as one binary COPY into a temporary table and
one set-based statement (`SetBasedSql`), the fastest correct way found to write it (PITFALLS.md);
the Quix Streams peer (`quix_peer`) sends its batches with the very same SQL.

The statement claims each op key with its ledger row first (`ON CONFLICT DO NOTHING`: a key done
before is left alone, as a duplicate), releases the claimed reservations that are still held, due
and of the event's tenant, and records the released ones applied; a claimed key whose reservation
was not released is recorded skipped by a second statement (none in the bench).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from lapse.devtools.bench.lean import driver_connection
from lapse.devtools.demo_tables import reservations
from lapse.kernel.database import engine_from_settings, qualified_name
from lapse.kernel.heap import set_aside_startup_heap
from lapse.kernel.ledger import ExpiryEvent, millis
from lapse.kernel.models import cleanup_ledger, ledger_transitions, outbox
from lapse.kernel.schema_names import CLEANUP_OUTCOME
from lapse.kernel.settings import Settings

# The batch's columns, in COPY order, with their PostgreSQL types.
BATCH_COLUMNS = (("op_key", "text"), ("kind", "text"), ("tenant", "text"), ("subject_id", "text"),
                 ("subject", "int8"), ("due_at", "timestamptz"), ("due_ms", "int8"), ("correlation_id", "text"),
                 ("source", "text"), ("attempt", "int4"), ("replay_id", "text"), ("event_topic", "text"),
                 ("event_partition", "int4"), ("event_offset", "int8"))
BATCH_TABLE = "lapse_bench_batch"

# The transition and the outcome of each row of `{{done}}`, recorded `{{status}}`: two CTEs.
_RECORD = """
t AS (
    INSERT INTO {{transitions}} (op_key, from_state, to_state, attempt, actor, replay_id, correlation_id, at,
                                 event_topic, event_partition, event_offset)
    SELECT op_key, 'pending', '{status}', attempt + 1, %(worker)s, replay_id, correlation_id, now(),
           event_topic, event_partition, event_offset FROM {done}
), o AS (
    INSERT INTO {{outbox}} (topic, key, schema, payload, headers, created_at)
    SELECT %(topic)s, op_key, '{{schema}}',
           json_build_object('op_key', op_key, 'kind', kind, 'tenant', tenant, 'subject_id', subject_id,
                             'status', '{status}', 'attempt', attempt + 1, 'failure_class', NULL, 'reason', NULL,
                             'due_at', due_ms, 'occurred_at', (extract(epoch from now()) * 1000)::int8,
                             'correlation_id', correlation_id, 'replay_id', replay_id, 'worker', %(worker)s),
           '{{{{}}}}', now() FROM {done}
)"""

_CLAIM_AND_APPLY = """
WITH b AS MATERIALIZED (SELECT * FROM pg_temp.{batch}),
ins AS (
    INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at, correlation_id, source,
                          replay_id, duplicates, created_at, updated_at, finished_at)
    SELECT op_key, kind, tenant, subject_id, 'applied', attempt + 1, due_at, correlation_id, source, replay_id,
           0, now(), now(), now() FROM b
    ON CONFLICT DO NOTHING RETURNING op_key
), rel AS (
    UPDATE {business} r SET status = 'released', released_at = now() FROM b
    WHERE r.id = ANY(ARRAY(SELECT b.subject FROM b JOIN ins USING (op_key))) AND r.id = b.subject
      AND r.tenant = b.tenant AND r.status = 'held' AND r.expires_at <= now()
    RETURNING b.op_key
), done AS MATERIALIZED (SELECT b.* FROM b JOIN rel USING (op_key)),""" \
    + _RECORD.format(status="applied", done="done") + """
SELECT op_key FROM ins WHERE op_key NOT IN (SELECT op_key FROM rel)
"""

_SKIP = """
WITH s AS (
    UPDATE {ledger} SET state = 'skipped' WHERE op_key = ANY(%(keys)s) AND finished_at = now() RETURNING op_key
), b AS (SELECT * FROM pg_temp.{batch} WHERE op_key IN (SELECT op_key FROM s)),""" + _RECORD.format(
    status="skipped", done="b") + """
SELECT count(*) FROM b
"""


@dataclass(frozen=True)
class SetBasedSql:
    """The bound's statements with the table names of one database (schema-qualified, quoted)."""

    create_batch: str
    copy_batch: str
    claim_and_apply: str
    skip: str

    @classmethod
    def for_names(cls, ledger: str, transitions: str, box: str, business: str) -> SetBasedSql:
        names = {"ledger": ledger, "transitions": transitions, "outbox": box, "business": business,
                 "batch": BATCH_TABLE, "schema": CLEANUP_OUTCOME}
        columns = ", ".join(f"{name} {kind}" for name, kind in BATCH_COLUMNS)
        return cls(
            create_batch=f"CREATE TEMPORARY TABLE IF NOT EXISTS {BATCH_TABLE} ({columns}) ON COMMIT DELETE ROWS",
            copy_batch=f"COPY pg_temp.{BATCH_TABLE} FROM STDIN (FORMAT BINARY)",
            claim_and_apply=_CLAIM_AND_APPLY.format(**names), skip=_SKIP.format(**names))

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def batch_row(event: ExpiryEvent, topic: str, partition: int, offset: int) -> tuple[Any, ...]:
    """One event as a row of the batch (BATCH_COLUMNS)."""
    return (event.op_key, event.kind, event.tenant, event.subject_id, int(event.subject_id), event.due_at,
            millis(event.due_at), event.correlation_id, event.source, event.attempt, event.replay_id,
            topic, partition, offset)


def write_batch(cur: Any, sql: SetBasedSql, rows: Sequence[tuple[Any, ...]], worker: str, topic: str) -> None:
    """COPY `rows` into the batch table and apply them (the caller commits)."""
    with cur.copy(sql.copy_batch) as copy:
        copy.set_types([kind for _, kind in BATCH_COLUMNS])
        for row in rows:
            copy.write_row(row)
    cur.execute(sql.claim_and_apply, {"worker": worker, "topic": topic})
    unreleased = [key for (key,) in cur.fetchall()]
    if unreleased:
        cur.execute(sql.skip, {"keys": unreleased, "worker": worker, "topic": topic})


def database_bound(settings: Settings, events: Sequence[ExpiryEvent], worker: str = "bench-bound") -> dict[str, Any]:
    """Write `events` (decoded already) in batches of the stage's batch size with `SetBasedSql`, one
    transaction each, timed from the first batch's rows to the last commit."""
    engine = engine_from_settings(settings)
    raw, conn = driver_connection(engine)
    batch_size, topic = settings.processor.batch_size, settings.topology.outcomes
    try:
        sql = SetBasedSql.for_names(qualified_name(engine, cleanup_ledger), qualified_name(engine, ledger_transitions),
                                    qualified_name(engine, outbox), qualified_name(engine, reservations))
        with conn.cursor() as cur:
            cur.execute(sql.create_batch)
            conn.commit()
            set_aside_startup_heap()  # the heap as a worker's is once it started
            started = time.perf_counter()
            for start in range(0, len(events), batch_size):
                rows = [batch_row(e, settings.topology.expiry, i % 4, i)
                        for i, e in enumerate(events[start:start + batch_size], start)]
                write_batch(cur, sql, rows, worker, topic)
                conn.commit()
            seconds = time.perf_counter() - started
    finally:
        raw.close()
        engine.dispose()
    return {"events": len(events), "batch_size": batch_size, "seconds": round(seconds, 3),
            "events_per_s": round(len(events) / seconds, 1),
            "method": "binary COPY into a temporary table + one set-based statement per batch"}

