"""The outbox relay: publish outbox rows in id order, then mark them sent.

Rows are locked while they are produced and flushed, and marked sent in the same transaction, so
two relays never publish a row twice at once; a crash between flush and commit republishes the
batch (at-least-once). Each outcome carries its outbox id as `outcome_id`, which lets readers drop
such repeats. On PostgreSQL `run_relay` leases hash slots of the outbox keys (`relay_slots`), so
several relays publish in parallel, each key's rows by one relay in id order; on SQLite (one
process) it relays every row. `run_relay` waits out a database, broker or registry outage
(`lapse.kernel.outages`) rather than exit.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import Producer
from sqlalchemy import Connection, Engine

from lapse.kernel.clock import Clock, now_in
from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import Outage, is_transient
from lapse.kernel.schema_names import CLEANUP_OUTCOME
from lapse.kernel.trace_context import TRACEPARENT
from lapse.kernel.tracing import RELAY, stage
from lapse.producers import relay_queries
from lapse.producers.relay_queries import SLOTS
from lapse.producers.relay_slots import REBALANCE_S, SlotLease

log = get_logger("relay")


def relay_batch(engine: Engine, producer: Producer, codec: Codec, delivery: DeliveryTracker,
                limit: int, clock: Clock | None = None) -> int:
    """Publish up to `limit` unsent outbox rows; returns how many were published."""
    with engine.begin() as conn:
        return _publish(conn, relay_queries.lock_unsent(conn, limit), producer, codec, delivery, clock)


def relay_slot_batch(lease: SlotLease, producer: Producer, codec: Codec, delivery: DeliveryTracker,
                     limit: int, clock: Clock | None = None) -> int:
    """Publish up to `limit` unsent rows of the slots `lease` holds (after its periodic rebalance),
    on the lease's own connection; returns how many were published."""
    slots = lease.rebalance()
    if not slots:
        return 0
    conn = lease.connection()
    with conn.begin():
        # Holding every slot, the filter would only cost time.
        rows = relay_queries.lock_unsent(conn, limit, None if len(slots) == SLOTS else sorted(slots))
        return _publish(conn, rows, producer, codec, delivery, clock)


def _publish(conn: Connection, rows: list[Any], producer: Producer, codec: Codec, delivery: DeliveryTracker,
             clock: Clock | None) -> int:
    """Produce `rows` in order, wait for every acknowledgement, then mark them sent (in the
    caller's transaction, which holds their locks)."""
    if not rows:
        return 0
    traced = (((r.headers or {}).get(TRACEPARENT), r.key) for r in rows)  # read only when spans are recorded
    with stage(RELAY, traced, {"lapse.batch.records": len(rows)}):
        _produce(rows, producer, codec, delivery)
    relay_queries.mark_sent(conn, [r.id for r in rows], now_in(conn, clock),
                            (min(r.created_at for r in rows), max(r.created_at for r in rows)))
    return len(rows)


def _produce(rows: list[Any], producer: Producer, codec: Codec, delivery: DeliveryTracker) -> None:
    """Produce `rows` in order and wait for every acknowledgement."""
    for row in rows:
        payload = dict(row.payload)
        if row.schema == CLEANUP_OUTCOME:
            payload["outcome_id"] = row.id
        headers: list[tuple[str, str | bytes | None]] = [
            (k, str(v).encode()) for k, v in (row.headers or {}).items()]
        headers.append(("lapse-outbox-id", str(row.id).encode()))
        producer.produce(row.topic, key=row.key.encode(), value=codec.encode(row.schema, payload),
                         headers=headers, on_delivery=delivery)
        producer.poll(0)
    delivery.flush(producer)


def relay_until_empty(engine: Engine, producer: Producer, codec: Codec, limit: int) -> int:
    delivery = DeliveryTracker()
    total = 0
    while n := relay_batch(engine, producer, codec, delivery, limit):
        total += n
    return total


def run_relay(engine: Engine, producer: Producer, codec: Codec, *, limit: int, idle_s: float,
              stop: threading.Event, exit_when_idle: float | None = None,
              rebalance_s: float = REBALANCE_S) -> int:
    """Relay until stopped (or, with `exit_when_idle`, until the whole outbox was empty that long).
    On PostgreSQL the relay leases slots (rebalanced every `rebalance_s`) and gives them back when
    it stops, after its last batch. A transient failure (`is_transient`) is waited out with
    backoff; the batch it hit is relayed again (a lease whose connection failed is dropped and taken
    anew). Sent rows are removed by retention (`lapse prune`), not here."""
    lease = SlotLease(engine, rebalance_s=rebalance_s) if engine.dialect.name == "postgresql" else None
    try:
        return _relay_loop(engine, lease, producer, codec, limit=limit, idle_s=idle_s, stop=stop,
                           exit_when_idle=exit_when_idle)
    finally:
        if lease is not None:
            lease.release()


def _relay_loop(engine: Engine, lease: SlotLease | None, producer: Producer, codec: Codec, *, limit: int,
                idle_s: float, stop: threading.Event, exit_when_idle: float | None) -> int:
    delivery = DeliveryTracker()
    outage = Outage("relay", log)
    total, idle_since = 0, time.monotonic()
    while not stop.is_set():
        try:
            if lease is None:
                n = relay_batch(engine, producer, codec, delivery, limit)
            else:
                n = relay_slot_batch(lease, producer, codec, delivery, limit)
                if not n and exit_when_idle is not None and _others_have_work(engine):
                    idle_since = time.monotonic()  # another relay's slots (or soon ours) are not done
            now = time.monotonic()
        except Exception as exc:
            if not is_transient(exc):
                raise
            delivery.failures.clear()  # reports of the failed batch; it is relayed again
            if lease is not None:
                lease.drop()
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


def _others_have_work(engine: Engine) -> bool:
    """Whether any row is unsent, in this relay's slots or not: a bounded run is idle only then."""
    with engine.connect() as conn:
        return relay_queries.any_unsent(conn)
