"""The bench's input: expiry events for held reservations, produced to a stage's own expiry topic,
and the checks that a consumer group committed all of it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime

from confluent_kafka import ConsumerGroupState, TopicPartition

from lapse.devtools.demo_kinds import RELEASE
from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import DeliveryTracker, make_admin, make_consumer, make_producer
from lapse.kernel.ledger import ExpiryEvent, expiry_event, expiry_record
from lapse.kernel.logs import get_logger
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import Settings
from lapse.kernel.topology import load_topology
from lapse.producers import emit_events
from lapse.readers import manual_consumer
from lapse.shell.provisioning import apply, plan

log = get_logger("bench")


def reservation_event(rid: int, due_at: datetime) -> ExpiryEvent:
    """The event the sweep would emit for held reservation `rid`."""
    return expiry_event(RELEASE, rid, f"tenant-{rid % 7}", due_at, source="sweep")


def create_expiry_topic(settings: Settings, partitions: int, timeout: float = 30.0) -> str:
    """Create the expiry topic of `settings`' topology as declared, but with the bench's partition
    count and replication 1; returns its name once every partition has a leader."""
    return create_role_topic(settings, "expiry", partitions, timeout)


def create_role_topic(settings: Settings, role: str, partitions: int, timeout: float = 30.0) -> str:
    """Create the topic of `role` (expiry, outcomes, dlq) of `settings`' topology as declared, but
    with the bench's partition count and replication 1; returns its name once every partition has
    a leader."""
    topology = load_topology(settings.topics.file, settings.topics.prefix, replication_factor=1)
    name = getattr(topology, role)
    spec = next(spec for spec in topology.specs if spec.name == name)
    admin = make_admin(settings)
    failed = [a.detail for a in apply(admin, plan(admin, [replace(spec, partitions=partitions)]), timeout)
              if a.status != "done"]
    if failed:
        raise RuntimeError(f"cannot create the bench topic {spec.name}: {failed[0]}")
    return spec.name


def delete_topics(settings: Settings, names: list[str], timeout: float = 30.0) -> None:
    """Delete the bench's topics; a topic that will not go is logged, not raised (the run is done)."""
    if not names:
        return
    admin = make_admin(settings)  # kept until the futures resolve: a dropped client cancels them
    futures = admin.delete_topics(names, operation_timeout=timeout, request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout)
        except Exception as exc:  # KafkaException: deletion disabled, or the broker is gone
            log.warning("bench topic not deleted", extra={"topic": name, "error": str(exc)})


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
    consumer = manual_consumer(settings)
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


def encoded_records(settings: Settings, events: Iterable[ExpiryEvent], now: datetime) -> list[tuple[bytes, bytes]]:
    """Each event as the (key, value) the sweep produces, encoded ahead of a timed produce."""
    codec = Codec.from_settings(settings)
    return [(e.op_key.encode(), codec.encode(EXPIRY_EVENT, expiry_record(e, now))) for e in events]


def produce_encoded(settings: Settings, topic: str, records: Iterable[tuple[bytes, bytes]]) -> None:
    """Produce records encoded beforehand (`encoded_records`), all acknowledged on return."""
    producer = make_producer(settings, **{"linger.ms": 20, "batch.size": 1_000_000})
    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)
    if producer.flush(60):
        raise RuntimeError(f"records not acknowledged by the broker on {topic}")


def wait_group_stable(settings: Settings, group: str, members: int, alive: Callable[[], bool],
                      timeout_s: float = 60.0) -> None:
    """Wait until `group` is stable with `members` members, each assigned a partition."""
    admin = make_admin(settings)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"a member of {group} exited before the group was stable")
        found = admin.describe_consumer_groups([group])[group].result(10)
        if (found.state == ConsumerGroupState.STABLE and len(found.members) == members
                and all(m.assignment.topic_partitions for m in found.members)):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{group} not stable with {members} members in {timeout_s:.0f}s")
