"""The caller of a declared `kafka-produce` effect: one record per operation to an effect topic.

The record is keyed by the op key, carries the op key and the attempt as headers
(`lapse-op-key`, `lapse-attempt`) and a JSON value naming the operation, and goes to the key's
partition (crc32 of the key, as librdkafka's `consistent` partitioner) through an idempotent,
acks=all producer; the call returns once the delivery report says the record is written.

Once per op key, as a (read_committed) reader sees the topic: a first attempt produces; a later
attempt (a retry, or the next holder after a lease takeover, e.g. the last holder was killed
between its produce and its commit) first reads the key's partition and produces only if no
record with this op key is there. A call's record has landed or failed before its lease can end
(the delivery timeout is the declared `timeout_s`, at most half the lease), so the check sees it.
Kafka transactions alone would not do: a record committed just before the worker dies is
visible while its ledger row is not, so only looking tells. The check reads the partition from
its start (on retries and takeovers only): give effect topics a retention of days, not months.

Produce errors become failure classes: retriable broker and network errors temporary; a record
too large, a topic the producer may not write or that does not exist invalid (no retry cures
them); no delivery report in time ambiguous (the record may have landed: the retry's check
finds it).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import zlib
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Producer, TopicPartition

from lapse.kernel.kafka_clients import PERMANENT_ERRORS, make_consumer, make_producer
from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.kinds.effects.kafka_produce import KafkaProduceEffect
from lapse.kernel.settings import Settings
from lapse.kernel.text import one_line
from lapse.processors.effects.base import CallerSetup
from lapse.processors.failures import AMBIGUOUS, INVALID, TEMPORARY, EffectFailure

HEADER_OP_KEY = "lapse-op-key"
HEADER_ATTEMPT = "lapse-attempt"
# The group id prefix of readers that only assign partitions and commit nothing (as readers.offsets).
CHECK_GROUP_PREFIX = "lapse-manual-"
# No retry cures these: the record's own size or form, a producer not allowed, a topic not there.
INVALID_ERRORS = PERMANENT_ERRORS | {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                                     KafkaError._UNKNOWN_PARTITION}
# The record may have been written: no report in time.
AMBIGUOUS_ERRORS = frozenset({KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT})


def partition_of(key: bytes, partitions: int) -> int:
    """The key's partition: crc32 modulo the partition count (librdkafka's `consistent`)."""
    return zlib.crc32(key) % partitions


def produce_failure(err: KafkaError, topic: str) -> EffectFailure:
    """The failure class of a produce error on `topic`."""
    reason = f"produce to {one_line(topic, 80)}: {err.name()}: {one_line(err.str(), 160)}"
    if err.code() in INVALID_ERRORS:
        return EffectFailure(INVALID, reason)
    if err.code() in AMBIGUOUS_ERRORS:
        return EffectFailure(AMBIGUOUS, reason)
    return EffectFailure(TEMPORARY, reason)


def _error_of(exc: KafkaException) -> KafkaError | None:
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else None


class KafkaProduceCaller:
    """Produces the records of one kind's `kafka-produce` effect; one producer per kind."""

    def __init__(self, effect: KafkaProduceEffect, settings: Settings) -> None:
        self.effect = effect
        self.settings = settings
        self.topic = effect.topic  # the effective name: the compiled declaration holds it
        # A record lands or fails before the call's lease can end (then a takeover's check sees it).
        self.timeout_s = min(effect.timeout_s, settings.processor.lease_seconds / 2)
        timeout_ms = max(1, int(self.timeout_s * 1000))
        self.producer: Producer = make_producer(settings, **{
            "linger.ms": 0, "message.timeout.ms": timeout_ms, "allow.auto.create.topics": False,
            "request.timeout.ms": min(timeout_ms, 30_000),
            "client.id": f"lapse-effect-{settings.runtime.worker_id}"})
        self._partitions: int | None = None
        self._lock = threading.Lock()

    def partitions(self) -> int:
        """The topic's partition count, read once (topics apply never changes it)."""
        with self._lock:
            if self._partitions is None:
                try:
                    metadata = self.producer.list_topics(self.topic, timeout=self.timeout_s)
                except KafkaException as exc:
                    err = _error_of(exc)
                    raise (produce_failure(err, self.topic) if err is not None
                           else EffectFailure(TEMPORARY, f"no metadata for {self.topic}: {exc}")) from None
                topic = metadata.topics.get(self.topic)
                if topic is None or topic.error is not None or not topic.partitions:
                    err = topic.error if topic is not None else None
                    if err is not None:
                        raise produce_failure(err, self.topic)
                    raise EffectFailure(TEMPORARY, f"no partitions of {one_line(self.topic, 80)} known yet")
                self._partitions = len(topic.partitions)
            return self._partitions

    def endpoint(self, call: EffectCall) -> str:
        """The topic every call of the kind produces to."""
        return self.topic

    def __call__(self, call: EffectCall) -> None:
        key = call.op_key.encode()
        partition = partition_of(key, self.partitions())
        if call.attempt > 1 and self.already_produced(call.op_key, partition):
            return
        value = json.dumps({"op_key": call.op_key, "kind": call.kind, "subject_id": call.subject_id,
                            "tenant": call.tenant}).encode()
        headers: list[tuple[str, str | bytes | None]] = [(HEADER_OP_KEY, key),
                                                         (HEADER_ATTEMPT, str(call.attempt).encode())]
        reports: list[KafkaError | None] = []
        delivered = threading.Event()

        def report(err: KafkaError | None, _msg: Any) -> None:
            reports.append(err)
            delivered.set()

        try:
            self.producer.produce(self.topic, key=key, value=value, headers=headers, partition=partition,
                                  on_delivery=report)
        except BufferError:
            raise EffectFailure(TEMPORARY, f"the producer's queue for {one_line(self.topic, 80)} is full") from None
        except KafkaException as exc:
            err = _error_of(exc)
            if err is None:
                raise
            raise produce_failure(err, self.topic) from None
        deadline = time.monotonic() + self.timeout_s + 5.0  # the producer times out first
        while not delivered.is_set():
            if time.monotonic() > deadline:
                raise EffectFailure(AMBIGUOUS, f"no delivery report from {one_line(self.topic, 80)} in time")
            self.producer.poll(0.05)
        if reports[0] is not None:
            raise produce_failure(reports[0], self.topic)

    def already_produced(self, op_key: str, partition: int) -> bool:
        """Whether the key's partition holds a committed record of `op_key` (read_committed, from
        its start to partition EOF: the end as the broker reports it, which ListOffsets is not on
        every broker). A check that cannot finish is a temporary failure."""
        consumer = make_consumer(self.settings, f"{CHECK_GROUP_PREFIX}{uuid.uuid4().hex[:12]}", **{
            "isolation.level": "read_committed", "enable.partition.eof": True, "fetch.wait.max.ms": 50})
        wanted = op_key.encode()
        timeout = max(self.timeout_s, 5.0)
        where = one_line(f"{self.topic}[{partition}]", 100)
        try:
            consumer.assign([TopicPartition(self.topic, partition, OFFSET_BEGINNING)])
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                error = msg.error()
                if error is None:
                    if dict(msg.headers() or []).get(HEADER_OP_KEY) == wanted:
                        return True
                elif error.code() == KafkaError._PARTITION_EOF:
                    return False
                else:
                    raise EffectFailure(TEMPORARY, f"checking {where}: {one_line(error.str(), 160)}")
        except KafkaException as exc:
            raise EffectFailure(TEMPORARY, f"checking {where}: {one_line(str(exc), 160)}") from None
        finally:
            consumer.close()
        raise EffectFailure(TEMPORARY, f"checking {where} for {one_line(op_key, 80)} did not finish in {timeout:g} s")

    def close(self) -> None:
        self.producer.flush(self.timeout_s)


def build(declared: KafkaProduceEffect, setup: CallerSetup) -> KafkaProduceCaller:
    if setup.settings is None:
        raise ValueError("a kafka-produce effect needs the worker's settings (the Kafka connection)")
    return KafkaProduceCaller(declared, setup.settings)
