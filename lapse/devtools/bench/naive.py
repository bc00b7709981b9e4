"""The naive baseline: one consumer, one transaction and one synchronous offset commit per message,
doing the same claim + conditional update + ledger/outbox writes (apply_batch of one event)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from lapse.devtools.bench.ledger_watch import ledger_span, wait_terminal
from lapse.devtools.demo_kinds import load_demo_kinds
from lapse.kernel.codec import Codec
from lapse.kernel.database import engine_from_settings
from lapse.kernel.kafka_clients import make_consumer
from lapse.kernel.ledger import ExpiryEvent
from lapse.kernel.settings import Settings
from lapse.processors import BatchScope, apply_batch


def run_naive(settings: Settings, events: int) -> dict[str, Any]:
    """Process the first `events` records of the stage's expiry topic the way most teams first
    write it (in the stage's cleanup group)."""
    engine = engine_from_settings(settings)
    codec = Codec.from_settings(settings)
    kinds = load_demo_kinds(engine)
    topology = settings.topology
    consumer = make_consumer(settings, topology.groups.cleanup)
    consumer.subscribe([topology.expiry])
    done = 0
    try:
        while done < events:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            event = ExpiryEvent.from_record(codec.decode_expected("expiry_event", msg.value() or b""))
            with engine.begin() as conn:
                apply_batch(BatchScope(conn, kinds=kinds, topics=topology, worker="bench-naive",
                                       now=datetime.now(UTC), lease=timedelta(seconds=30)), [event])
            consumer.commit(message=msg, asynchronous=False)
            done += 1
        span = ledger_span(engine, events, wait_terminal(engine, events))
    finally:
        consumer.close()
        engine.dispose()
    return {"events": events, "seconds": round(span.seconds, 3), "events_per_s": round(span.rate, 1)}
