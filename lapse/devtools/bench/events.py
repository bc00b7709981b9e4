"""The bench's input: expiry events for held reservations, produced once to a fresh topic, and
the checks that a consumer group committed all of it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from datetime import datetime

from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker, make_admin, make_consumer, make_producer
from lapse.kernel.kinds import RELEASE_RESERVATION
from lapse.kernel.ledger import ExpiryEvent, expiry_event
from lapse.kernel.settings import Settings
from lapse.producers.emit import emit_events


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def reservation_event(rid: int, due_at: datetime) -> ExpiryEvent:
    """The event the sweep would emit for held reservation `rid`."""
    return expiry_event(RELEASE_RESERVATION.name, rid, f"tenant-{rid % 7}", due_at, source="sweep")


def create_topic(settings: Settings, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Create `name` and return once every partition has a leader."""
    admin = make_admin(settings)
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                        operation_timeout=timeout)[name].result(timeout)
    deadline = time.monotonic() + timeout
    while True:
        topic = admin.list_topics(name, timeout=timeout).topics.get(name)
        if topic and topic.error is None and len(topic.partitions) == partitions and all(
                p.leader >= 0 for p in topic.partitions.values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name} has no leaders after {timeout:.0f}s")
        time.sleep(0.1)


def produce_events(settings: Settings, topic: str, events: Iterable[ExpiryEvent], now: datetime) -> int:
    """Produce expiry events keyed by op key with the sweep's own emitter; returns the count."""
    producer = make_producer(settings, **{"linger.ms": 20, "batch.size": 1_000_000})
    events = list(events)
    emit_events(producer, Codec.from_settings(settings), DeliveryTracker(), topic, events, now)
    return len(events)


def partitions_of(settings: Settings, topic: str) -> list[int]:
    return sorted(make_admin(settings).list_topics(topic, timeout=10).topics[topic].partitions)


def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    """partition → high watermark (Apache Kafka reports the true end of the log)."""
    consumer = make_consumer(settings, unique_name("bench-watermarks"))
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions_of(settings, topic)}
    finally:
        consumer.close()


def committed_offsets(settings: Settings, topic: str, group: str) -> dict[int, int]:
    """partition → committed offset of `group` (-1001 when it committed none)."""
    consumer = make_consumer(settings, group)
    try:
        tps = [TopicPartition(topic, p) for p in partitions_of(settings, topic)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
    finally:
        consumer.close()


def committed_all(settings: Settings, topic: str, group: str) -> bool:
    """True when `group` committed the end of every partition of `topic`."""
    return committed_offsets(settings, topic, group) == end_offsets(settings, topic)
