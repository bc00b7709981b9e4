"""Read-side rates: a reconciler pass over a large business table, and an audit replay
of a stage's expiry topic (manual assignment, read to EOF, every record decoded)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from sqlalchemy import text

from lapse.devtools.bench.databases import seed_held
from lapse.devtools.bench.events import partitions_of
from lapse.devtools.demo_kinds import load_demo_kinds
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings, qualified_name
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.models import cleanup_ledger
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import Settings
from lapse.readers import EVENT_FIELDS, manual_consumer
from lapse.reconciler import scan_rate

IN_FLIGHT_LEDGER = (
    "INSERT INTO {ledger} (op_key, kind, tenant, subject_id, state, attempt, due_at,"
    " correlation_id, source, duplicates, created_at, updated_at)"
    " SELECT 'release-reservation:' || id, 'release-reservation', tenant, id::text, 'pending', 0,"
    " expires_at, md5(id::text), 'sweep', 0, now(), now() FROM reservations"
    " ON CONFLICT DO NOTHING")


def reconciler_scan(settings: Settings, rows: int) -> dict[str, Any]:
    """One reconciler pass (lapse.reconciler.scan.scan_rate) after adding `rows` due holds, with every
    hold's work in flight: each has a fresh `pending` ledger row, so the pass reads every business
    row and its ledger state and has nothing to re-emit or report (on the stage's database; a
    re-emitted event would go to the stage's expiry topic)."""
    engine = engine_from_settings(settings)
    try:
        with engine.connect() as conn:
            existing = conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM reservations").scalar_one()
        seed_held(engine, rows, datetime.now(UTC) - timedelta(hours=1), first_id=existing + 1)
        with engine.begin() as conn:
            ledger = qualified_name(conn, cleanup_ledger)
            conn.execute(text(IN_FLIGHT_LEDGER.format(ledger=ledger)))
            conn.execute(text(f"ANALYZE {ledger}"))
        producer = make_producer(settings)
        report, rate = scan_rate(engine, producer, Codec.from_settings(settings), settings, load_demo_kinds(engine))
    finally:
        engine.dispose()
    scanned = report.scanned + report.ledger_scanned
    return {"rows": scanned, "pages": report.pages, "page_size": settings.reconciler.page_size,
            "seconds": round(scanned / rate, 3) if rate else None, "rows_per_s": round(rate, 1),
            "reemitted": report.reemitted, "method": "lapse.reconciler.scan.scan_rate, work in flight"}


def audit_replay(settings: Settings) -> dict[str, Any]:
    """Read the expiry topic of `settings` from the beginning to EOF by manual assignment, decoding
    every record as the audit does (only the fields it uses); timed from the first record
    (connecting and the first fetch are not reading)."""
    topic = settings.topology.expiry
    codec = Codec.from_settings(settings)
    consumer = manual_consumer(settings)
    parts = partitions_of(settings, topic)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    records, started = 0, None
    at_eof: set[int | None] = set()
    try:
        while len(at_eof) < len(parts):
            for msg in consumer.consume(10_000, 0.05):
                err = msg.error()
                if err is None:
                    started = started or time.perf_counter()
                    codec.decode_fields(EXPIRY_EVENT, msg.value() or b"", EVENT_FIELDS)
                    records += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_eof.add(msg.partition())
                else:
                    raise KafkaException(err)
        seconds = time.perf_counter() - (started or time.perf_counter())
    finally:
        consumer.close()
    rate = round(records / seconds, 1) if seconds else 0.0
    return {"records": records, "seconds": round(seconds, 3), "records_per_s": rate,
            "method": "manual assignment to EOF, the audit's projected decode"}
