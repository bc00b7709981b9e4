"""The outbox relay: publish outbox rows in id order, then mark them sent.

Rows are locked while they are produced and flushed, and marked sent in the same transaction, so
two relays never publish a row twice at once; a crash between flush and commit republishes the
batch (at-least-once). Each outcome carries its outbox id as `outcome_id`, which lets readers drop
such repeats. `run_relay` waits out a database, broker or registry outage (`lapse.kernel.outages`)
rather than exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from confluent_kafka import Producer
from sqlalchemy import Engine

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import Outage, is_transient
from lapse.producers import relay_queries

log = get_logger("relay")


def relay_batch(engine: Engine, producer: Producer, codec: Codec, delivery: DeliveryTracker,
                limit: int, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> int:
    """Publish up to `limit` unsent outbox rows; returns how many were published."""
    with engine.begin() as conn:
        rows = relay_queries.lock_unsent(conn, limit)
        if not rows:
            return 0
        for row in rows:
            payload = dict(row.payload)
            if row.schema == "cleanup_outcome":
                payload["outcome_id"] = row.id
            headers: list[tuple[str, str | bytes | None]] = [
                (k, str(v).encode()) for k, v in (row.headers or {}).items()]
            headers.append(("lapse-outbox-id", str(row.id).encode()))
            producer.produce(row.topic, key=row.key.encode(), value=codec.encode(row.schema, payload),
                             headers=headers, on_delivery=delivery)
            producer.poll(0)
        delivery.flush(producer)
        relay_queries.mark_sent(conn, [r.id for r in rows], clock())
    return len(rows)


def relay_until_empty(engine: Engine, producer: Producer, codec: Codec, limit: int) -> int:
    delivery = DeliveryTracker()
    total = 0
    while n := relay_batch(engine, producer, codec, delivery, limit):
        total += n
    return total


def run_relay(engine: Engine, producer: Producer, codec: Codec, *, limit: int, idle_s: float,
              stop: threading.Event, exit_when_idle: float | None = None) -> int:
    """Relay until stopped. A transient failure (`is_transient`) is waited out with backoff; the
    batch it hit is relayed again. Sent rows are removed by retention (`lapse prune`), not here."""
    delivery = DeliveryTracker()
    outage = Outage("relay", log)
    total, idle_since = 0, time.monotonic()
    while not stop.is_set():
        try:
            n = relay_batch(engine, producer, codec, delivery, limit)
            now = time.monotonic()
        except Exception as exc:
            if not is_transient(exc):
                raise
            delivery.failures.clear()  # reports of the failed batch; it is relayed again
            outage.wait(exc, stop)
            idle_since = time.monotonic()
            continue
        outage.over()
        total += n
        if n:
            idle_since = now
            continue
        if exit_when_idle is not None and now - idle_since >= exit_when_idle:
            break
        stop.wait(idle_s)
    return total
