"""Read-side rates: the reconciler's keyset scan of a large business table, and an audit replay
of the expiry topic (manual assignment, read to EOF, every record decoded)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from lapse.bench.databases import seed_held
from lapse.bench.events import partitions_of, unique_name
from lapse.codec import Codec
from lapse.database import make_engine
from lapse.kafka_clients import make_consumer
from lapse.kinds import RELEASE_RESERVATION
from lapse.settings import Settings

SCAN_PAGE = 5000


def reconciler_scan(database_url: str, rows: int, page_size: int = SCAN_PAGE) -> dict:
    """Seed `rows` due holds (ids after the template's), then walk every due row in keyset pages
    of RELEASE_RESERVATION.eligible_page (the query the sweep and reconciler page with)."""
    engine = make_engine(database_url)
    now = datetime.now(UTC)
    try:
        with engine.connect() as conn:
            existing = conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM reservations").scalar_one()
        seed_held(engine, rows, now - timedelta(minutes=1), first_id=existing + 1)
        scanned, pages, cursor = 0, 0, None
        started = time.perf_counter()
        with engine.connect() as conn:
            while True:
                page = conn.execute(RELEASE_RESERVATION.eligible_page(
                    now, cursor, page_size, without_ledger=True)).all()
                if not page:
                    break
                scanned += len(page)
                pages += 1
                cursor = RELEASE_RESERVATION.to_eligible(page[-1]).cursor
        seconds = time.perf_counter() - started
    finally:
        engine.dispose()
    return {"rows": scanned, "pages": pages, "page_size": page_size, "seconds": round(seconds, 3),
            "rows_per_s": round(scanned / seconds, 1), "method": "keyset eligible_page scan"}


def audit_replay(settings: Settings, topic: str) -> dict:
    """Read `topic` from the beginning to EOF by manual assignment, decoding every record; timed
    from the first record (connecting and the first fetch are not reading)."""
    codec = Codec.from_settings(settings)
    consumer = make_consumer(settings, unique_name("bench-audit"), **{"fetch.max.bytes": 52428800})
    parts = partitions_of(settings, topic)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    records, at_eof, started = 0, set(), None
    try:
        while len(at_eof) < len(parts):
            for msg in consumer.consume(10_000, 0.05):
                err = msg.error()
                if err is None:
                    started = started or time.perf_counter()
                    codec.decode_expected("expiry_event", msg.value())
                    records += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_eof.add(msg.partition())
                else:
                    raise KafkaException(err)
        seconds = time.perf_counter() - (started or time.perf_counter())
    finally:
        consumer.close()
    return {"records": records, "seconds": round(seconds, 3), "records_per_s": round(records / seconds, 1) if seconds else 0.0,
            "method": "manual assignment to EOF, codec decode"}
