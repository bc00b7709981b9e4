"""The ceilings: the processor's batch transaction alone (no Kafka), and a raw COPY of the same
ledger rows (the fastest any write path could put them in the table)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from lapse.devtools.demo_kinds import load_demo_kinds
from lapse.kernel.database import engine_from_settings, make_engine, qualified_name
from lapse.kernel.ledger import APPLIED, ExpiryEvent
from lapse.kernel.models import cleanup_ledger
from lapse.kernel.settings import Settings
from lapse.processors import BatchScope, apply_batch

COPY_COLUMNS = ("op_key", "kind", "tenant", "subject_id", "state", "attempt", "due_at",
                "correlation_id", "source", "duplicates", "created_at", "updated_at", "finished_at")


def batch_transaction_limit(settings: Settings, events: list[ExpiryEvent],
                            worker: str = "bench-limit") -> dict[str, Any]:
    """Run apply_batch over pre-decoded events, one transaction per batch of the stage's batch size,
    as the processor does (on the stage's database and topology)."""
    lease = timedelta(seconds=30)
    batch_size = settings.processor.batch_size
    engine = engine_from_settings(settings)
    kinds = load_demo_kinds(engine)
    try:
        started = time.perf_counter()
        for start in range(0, len(events), batch_size):
            with engine.begin() as conn:
                apply_batch(BatchScope(conn, kinds=kinds, topics=settings.topology, worker=worker,
                                       now=datetime.now(UTC), lease=lease), events[start:start + batch_size])
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    return {"events": len(events), "batch_size": batch_size, "seconds": round(seconds, 3),
            "events_per_s": round(len(events) / seconds, 1)}


def copy_limit(database_url: str, events: list[ExpiryEvent]) -> dict[str, Any]:
    """COPY one finished ledger row per event into the ledger table in one transaction."""
    now = datetime.now(UTC)
    rows = [(e.op_key, e.kind, e.tenant, e.subject_id, APPLIED, 1, e.due_at, e.correlation_id,
             e.source, 0, now, now, now) for e in events]
    columns = ", ".join(COPY_COLUMNS)
    engine = make_engine(database_url)
    raw = engine.raw_connection()
    try:
        driver = raw.driver_connection
        if not isinstance(driver, psycopg.Connection):
            raise RuntimeError(f"the COPY limit needs PostgreSQL through psycopg, not {database_url.split(':')[0]}")
        started = time.perf_counter()
        ledger = qualified_name(engine, cleanup_ledger)
        with driver.cursor() as cur, cur.copy(f"COPY {ledger} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        raw.commit()
        seconds = time.perf_counter() - started
    finally:
        raw.close()
        engine.dispose()
    return {"rows": len(rows), "seconds": round(seconds, 3), "rows_per_s": round(len(rows) / seconds, 1)}
