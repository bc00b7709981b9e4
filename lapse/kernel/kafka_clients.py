"""Kafka client factories: every producer, consumer and admin client is configured here."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from lapse.kernel.settings import Settings


def producer_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """Idempotent, acks=all: a retried send never duplicates or reorders within a partition."""
    return {
        **settings.kafka.client_config(),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        **overrides,
    }


def consumer_config(settings: Settings, group: str, **overrides: Any) -> dict[str, Any]:
    """Manual offsets: nothing is stored or committed until the work behind it is durable."""
    return {
        **settings.kafka.client_config(),
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "session.timeout.ms": settings.processor.session_timeout_ms,
        "heartbeat.interval.ms": max(500, settings.processor.session_timeout_ms // 5),
        "max.poll.interval.ms": settings.processor.max_poll_interval_ms,
        "client.id": f"lapse-{settings.runtime.worker_id}",
        **overrides,
    }


def make_producer(settings: Settings, **overrides: Any) -> Producer:
    return Producer(producer_config(settings, **overrides))


def make_consumer(settings: Settings, group: str, **overrides: Any) -> Consumer:
    return Consumer(consumer_config(settings, group, **overrides))


def make_admin(settings: Settings) -> AdminClient:
    return AdminClient(settings.kafka.client_config())


class DeliveryFailed(RuntimeError):
    """A produced record was not acknowledged; nothing after it may be committed."""


class DeliveryTracker:
    """Collects delivery reports so a flush can tell whether every record landed."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}: {err}")

    def flush(self, producer: Producer, timeout: float = 30.0) -> None:
        """Wait for every outstanding record; raise if any failed or did not finish in time."""
        remaining = producer.flush(timeout)
        errors, self.errors = self.errors, []
        if remaining:
            raise DeliveryFailed(f"{remaining} records still in flight after {timeout:.0f}s")
        if errors:
            raise DeliveryFailed(f"{len(errors)} records failed, first: {errors[0]}")


__all__ = [
    "DeliveryFailed",
    "DeliveryTracker",
    "KafkaException",
    "consumer_config",
    "make_admin",
    "make_consumer",
    "make_producer",
    "producer_config",
]
