"""Producing expiry events: keyed by op key, and flushed before the caller moves on."""

from __future__ import annotations

from datetime import datetime

from confluent_kafka import Producer

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker
from lapse.kernel.ledger import ExpiryEvent, expiry_record
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.trace_context import carried


def emit_events(producer: Producer, codec: Codec, delivery: DeliveryTracker, topic: str,
                events: list[ExpiryEvent], now: datetime, traceparent: str | None = None) -> None:
    """Produce expiry events keyed by op key, each with the `traceparent` header when one is given,
    and wait until every one is acknowledged; raises DeliveryFailed otherwise, so no caller reports
    work done that is not on the topic."""
    headers = carried([], traceparent) or None
    for event in events:
        producer.produce(topic, key=event.op_key.encode(),
                         value=codec.encode(EXPIRY_EVENT, expiry_record(event, now)),
                         headers=headers, on_delivery=delivery)
        producer.poll(0)
    delivery.flush(producer)
