"""The delay-tier consumer (group `lapse-delay`): hold each partition until its head is due.

A record whose `lapse-due-at` is in the future pauses its partition and seeks back to it, so the
consumer keeps polling (never sleeping on a batch, never near max.poll.interval) while that
partition waits; other partitions keep flowing. Due records are forwarded to their `lapse-target`
topic (else `lapse.expiry`), flushed, and only then are their offsets committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from lapse.kernel.delays import TARGET_HEADER, parse_due
from lapse.kernel.kafka_clients import DeliveryTracker, make_consumer, make_producer
from lapse.kernel.logs import get_logger
from lapse.kernel.settings import Settings
from lapse.processors.commit import commit_offsets

log = get_logger("delay")


class DelayWorker:
    """One consumer of every delay tier; `forwarded` counts records sent on."""

    def __init__(self, settings: Settings, *, topics: list[str] | None = None,
                 stop: threading.Event | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.settings = settings
        self.topics = topics or settings.topology.delay_topics
        self.stop = stop or threading.Event()
        self.clock = clock
        self.owned: set[tuple[str, int]] = set()
        self.held: dict[tuple[str, int], datetime] = {}  # paused partition → its head's due time
        self.forwarded = 0
        self.consumer = make_consumer(settings, settings.topology.groups.delay)
        self.producer = make_producer(settings)
        self.delivery = DeliveryTracker()

    def _on_assign(self, consumer, partitions) -> None:
        self.owned |= {(p.topic, p.partition) for p in partitions}

    def _on_revoke(self, consumer, partitions) -> None:
        gone = {(p.topic, p.partition) for p in partitions}
        self.owned -= gone
        for tp in gone:
            self.held.pop(tp, None)

    def run(self) -> int:
        """Forward due records until stopped; returns how many were forwarded."""
        self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)
        try:
            while not self.stop.is_set():
                self._release_due()
                messages = self.consumer.consume(self.settings.processor.batch_size, self._wait_s())
                self._process([m for m in messages if self._usable(m)])
        finally:
            self.close()
        return self.forwarded

    def _wait_s(self) -> float:
        """Poll no longer than until the earliest held record is due (and at most 1 s)."""
        wait = self.settings.processor.poll_timeout_s
        if self.held:
            until = (min(self.held.values()) - self.clock()).total_seconds()
            wait = min(max(until, 0.01), 1.0)
        return wait

    def _usable(self, msg) -> bool:
        err = msg.error()
        if err is None:
            return (msg.topic(), msg.partition()) in self.owned
        if err.fatal():
            raise KafkaException(err)
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer error", extra={"error": err.str()})
        return False

    def _release_due(self) -> None:
        now = self.clock()
        due = [tp for tp, at in self.held.items() if at <= now]
        if due:
            for tp in due:
                del self.held[tp]
            self.consumer.resume([TopicPartition(t, p) for t, p in due])

    def _process(self, messages: list) -> None:
        now = self.clock()
        done = []
        for msg in messages:
            tp = (msg.topic(), msg.partition())
            if tp in self.held:
                continue  # its head is waiting: later records of the partition wait behind it
            due = parse_due(msg.headers())
            if due is not None and due > now:
                self._hold(tp, msg.offset(), due)
                continue
            target = dict(msg.headers() or []).get(TARGET_HEADER)
            self.producer.produce((target or b"").decode() or self.settings.topology.expiry,
                                  key=msg.key(), value=msg.value(), headers=msg.headers(),
                                  on_delivery=self.delivery)
            self.producer.poll(0)
            done.append(msg)
        if done:
            self.delivery.flush(self.producer)
            commit_offsets(self.consumer, self.owned, done)
            self.forwarded += len(done)

    def _hold(self, tp: tuple[str, int], offset: int, due: datetime) -> None:
        """Pause the partition and rewind it to the held record (pre-fetched records are dropped)."""
        part = TopicPartition(tp[0], tp[1], offset)
        self.consumer.pause([part])
        self.consumer.seek(part)
        self.held[tp] = due

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)
