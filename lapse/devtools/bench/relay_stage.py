"""The relay as its own stage: the outbox a worker leaves after `n` events (written by the
processor's batch transaction) published by one relay at the settings' batch size. Verified when
no row is left unsent and the outcomes topic holds one record per row."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select

from lapse.devtools.bench.events import create_role_topic, end_offsets
from lapse.devtools.bench.limits import batch_transaction_alone
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.models import outbox
from lapse.kernel.settings import Settings
from lapse.producers.relay import relay_until_empty


def run_relay(settings: Settings, events: Sequence[ExpiryEvent], partitions: int) -> dict[str, Any]:
    """Fill the stage's outbox with the outcomes of `events`, then time one relay draining it."""
    batch_transaction_alone(settings, events, worker="bench-relay")
    topic = create_role_topic(settings, "outcomes", partitions)
    engine = engine_from_settings(settings)
    producer = make_producer(settings)
    limit = settings.producer.relay_batch_size
    try:
        started = time.perf_counter()
        rows = relay_until_empty(engine, producer, Codec.from_settings(settings), limit)
        seconds = time.perf_counter() - started
        with engine.connect() as conn:
            unsent = conn.execute(select(func.count()).select_from(outbox)
                                  .where(outbox.c.sent_at.is_(None))).scalar_one()
    finally:
        producer.flush(10)
        engine.dispose()
    published = sum(end_offsets(settings, topic).values())
    reason = None
    if unsent or published != len(events) or rows != len(events):
        reason = f"{rows} rows relayed, {unsent} left unsent, {published} records on {topic}, {len(events)} expected"
    return {"rows": rows, "batch_size": limit, "seconds": round(seconds, 3),
            "rows_per_s": round(rows / seconds, 1) if seconds else None,
            "verified": reason is None, "reason": reason}
