"""Kafka client factories: every producer, consumer and admin client is configured here; and the
one judgement of a produce error (the record's own fault, permanent, or worth retrying)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from lapse.kernel.kafka_logs import KafkaLogSink
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


def _with_log_sink(settings: Settings, config: dict[str, Any]) -> dict[str, Any]:
    """`config` with librdkafka's log lines sent through Python logging, rate-limited (kafka_logs)."""
    return {"logger": KafkaLogSink.for_settings(settings), **config}


def make_producer(settings: Settings, **overrides: Any) -> Producer:
    return Producer(_with_log_sink(settings, producer_config(settings, **overrides)))


def make_consumer(settings: Settings, group: str, **overrides: Any) -> Consumer:
    return Consumer(_with_log_sink(settings, consumer_config(settings, group, **overrides)))


def make_admin(settings: Settings) -> AdminClient:
    return AdminClient(_with_log_sink(settings, settings.kafka.client_config()))


# librdkafka's default `message.max.bytes`: the largest record a producer sends.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000

# Produce errors the record itself causes (its size or its form): sending it again can never
# succeed, so they are never retried as transient; the caller handles the record instead (a dead
# letter without the original bytes, a dead letter instead of a forward).
RECORD_ERRORS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE,      # over the producer's message.max.bytes, or the topic's
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG,             # CORRUPT_MESSAGE
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_TIMESTAMP,
})
# Produce errors that no retry cures: the record's own, and a producer not allowed to write.
PERMANENT_ERRORS = RECORD_ERRORS | {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
}

DeliveryCallback = Callable[[KafkaError | None, Message], None]


def message_max_bytes(settings: Settings) -> int:
    """The largest record the producers of `settings` send (`message.max.bytes`)."""
    return int(producer_config(settings).get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))


def is_permanent(err: KafkaError) -> bool:
    """True for a produce error no retry cures (`PERMANENT_ERRORS`, or a fatal producer error)."""
    return bool(err.fatal()) or err.code() in PERMANENT_ERRORS


def produce_or_refusal(producer: Producer, topic: str, *, key: bytes | None, value: bytes | None,
                       headers: Any, on_delivery: DeliveryCallback) -> KafkaError | None:
    """Queue one record. Returns the error when the producer refuses the record itself at once
    (`RECORD_ERRORS`, e.g. over `message.max.bytes`), None when it is queued. A full queue is
    waited out, serving delivery reports meanwhile; any other error raises KafkaException."""
    while True:
        try:
            producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
            return None
        except BufferError:
            producer.poll(0.1)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in RECORD_ERRORS:
                return err
            raise


class DeliveryFailed(RuntimeError):
    """A produced record was not acknowledged; nothing after it may be committed. `permanent`:
    every failure was one no retry cures (see `PERMANENT_ERRORS`)."""

    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


class DeliveryTracker:
    """Collects delivery reports so a flush can tell whether every record landed."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, KafkaError]] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.failures.append((msg.topic() or "?", err))

    def or_refused(self, refused: Callable[[KafkaError], None]) -> DeliveryCallback:
        """The delivery callback of one record whose refusal for its own size or form
        (`RECORD_ERRORS`) the caller handles: `refused` gets that error; any other failure is
        tracked like every record's."""
        def report(err: KafkaError | None, msg: Message) -> None:
            if err is not None and err.code() in RECORD_ERRORS:
                refused(err)
            else:
                self(err, msg)
        return report

    def flush(self, producer: Producer, timeout: float = 30.0) -> None:
        """Wait for every outstanding record; raise if any failed or did not finish in time. A
        fatal producer error (e.g. refused a producer id: a principal allowed to write nothing) is
        raised by the client itself, and surfaces from the delivery callback it was serving as a
        SystemError chained to it; either way it ends here as one permanent DeliveryFailed."""
        try:
            remaining = producer.flush(timeout)
        except (KafkaException, SystemError) as exc:
            self.failures = []
            err = _kafka_error(exc)
            if err is None:
                raise
            raise DeliveryFailed(f"the producer failed: {err.str()}", permanent=is_permanent(err)) from None
        failures, self.failures = self.failures, []
        if remaining:
            raise DeliveryFailed(f"{remaining} records still in flight after {timeout:.0f}s")
        if failures:
            topic, err = failures[0]
            raise DeliveryFailed(f"{len(failures)} records failed, first: {topic}: {err.str()}",
                                 permanent=all(is_permanent(e) for _, e in failures))


def _kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError a client raised, found in `exc` or the exceptions it was raised from."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


__all__ = [
    "DEFAULT_MESSAGE_MAX_BYTES",
    "PERMANENT_ERRORS",
    "RECORD_ERRORS",
    "DeliveryCallback",
    "DeliveryFailed",
    "DeliveryTracker",
    "KafkaException",
    "consumer_config",
    "is_permanent",
    "make_admin",
    "make_consumer",
    "make_producer",
    "message_max_bytes",
    "produce_or_refusal",
    "producer_config",
]
