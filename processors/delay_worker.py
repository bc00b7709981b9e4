"""The delay-tier consumer (group `lapse-delay`): hold each partition until its head is released.

A tier holds a record at most its own delay (`lapse.kernel.delays` says why): a record is released
at its due time or at its head time (produced plus the tier's delay), whichever comes first. A
record not released yet pauses its partition and seeks back to it, so the consumer keeps polling
(never sleeping on a batch, never near max.poll.interval) while that partition waits; other
partitions keep flowing. A released record that is due is forwarded to the expiry topic; one that
is not due yet goes on its next trip, re-produced to the tier that fits its remaining wait with
one more `lapse-hops`. Everything sent is flushed, and only then are the offsets committed.

Headers are outside input here. A record whose headers cannot be acted on (`read_wake_up`: a
missing, repeated, malformed or out-of-range `lapse-due-at` or `lapse-hops`, a `lapse-target`
naming anything but the expiry topic; `next_trip`: more trips than any accepted wait takes) and a
record the expiry topic or a tier refuses (too large) are dead-lettered as poison with the reason,
and their offsets move on with the rest: no record stops a partition or the worker. Records go
only to the expiry topic or a tier of the topology, never to a topic a header names. A failure
outside the records (the broker unreachable) rewinds the batch and retries it after a capped
backoff.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, KafkaException, Message, TopicPartition

from lapse.kernel.codec import Codec
from lapse.kernel.delays import InvalidWakeUp, next_trip, read_wake_up, release_at
from lapse.kernel.kafka_clients import (
    DeliveryTracker,
    make_consumer,
    make_producer,
    message_max_bytes,
    produce_or_refusal,
)
from lapse.kernel.ledger import OriginalBudget
from lapse.kernel.logs import get_logger
from lapse.kernel.outages import Outage, is_transient
from lapse.kernel.settings import Settings
from lapse.processors.commit import commit_offsets
from lapse.processors.dead_letters import send_poison
from lapse.processors.decode import Poison, poison_of, position_of
from lapse.processors.rewind import rewind_and_back_off

log = get_logger("delay")


class DelayWorker:
    """One consumer of every delay tier; `forwarded` counts records sent on to the expiry topic,
    `trips` those re-produced to a tier for another trip, `dead_lettered` those sent to the DLQ."""

    def __init__(self, settings: Settings, *, topics: list[str] | None = None,
                 stop: threading.Event | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.settings = settings
        self.topics = topics or settings.topology.delay_topics
        self.expiry = settings.topology.expiry
        self.delays = {tier.topic: tier.delay_s for tier in settings.topology.tiers}
        self.stop = stop or threading.Event()
        self.clock = clock
        self.owned: set[tuple[str, int]] = set()
        # paused partition → (its head's offset, when that record is released)
        self.held: dict[tuple[str, int], tuple[int, datetime]] = {}
        # partition → the offset of its head whose hold has ended: acted on when read again, even
        # when its release time, read anew, would lie ahead (a produce time in the future)
        self.ripe: dict[tuple[str, int], int] = {}
        self.forwarded = 0
        self.trips = 0
        self.dead_lettered = 0
        self.consumer = make_consumer(settings, settings.topology.groups.delay)
        self.producer = make_producer(settings)
        self.delivery = DeliveryTracker()
        self.codec = Codec.from_settings(settings)
        self.budget = OriginalBudget.under(message_max_bytes(settings))
        self.outage = Outage("delay", log, settings=settings)

    def _on_assign(self, consumer, partitions) -> None:
        self.owned |= {(p.topic, p.partition) for p in partitions}

    def _on_revoke(self, consumer, partitions) -> None:
        gone = {(p.topic, p.partition) for p in partitions}
        self.owned -= gone
        for tp in gone:
            self.held.pop(tp, None)
            self.ripe.pop(tp, None)

    def run(self) -> int:
        """Forward due records until stopped; returns how many were forwarded."""
        self.consumer.subscribe(self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_revoke)
        try:
            while not self.stop.is_set():
                self._release_due()
                messages = self.consumer.consume(self.settings.processor.batch_size, self._wait_s())
                usable = [m for m in messages if self._usable(m)]
                if not usable:
                    continue
                try:
                    self._process(usable)
                    self.outage.over()
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    self._retry_later(usable, exc)
        finally:
            self.close()
        return self.forwarded

    def _wait_s(self) -> float:
        """Poll no longer than until the earliest held record is released (and at most 1 s)."""
        wait = self.settings.processor.poll_timeout_s
        if self.held:
            until = (min(at for _, at in self.held.values()) - self.clock()).total_seconds()
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
        due = [tp for tp, (_, at) in self.held.items() if at <= now]
        if due:
            for tp in due:
                self.ripe[tp] = self.held.pop(tp)[0]
            self.consumer.resume([TopicPartition(t, p) for t, p in due])

    def _process(self, messages: list[Message]) -> None:
        """Forward the due records and send the released ones not due on their next trip, hold
        each partition at its first record not released, dead-letter what cannot be sent; then
        flush, and commit what was sent or dead-lettered."""
        now = self.clock()
        done: list[Message] = []
        poison: list[Poison] = []
        sent: dict[int, str] = {}  # id of a record sent → the topic it was sent to
        refused: list[tuple[Message, str]] = []
        for msg in messages:
            topic, partition, offset = position_of(msg)
            tp = (topic, partition)
            if tp in self.held:
                continue  # its head is waiting: later records of the partition wait behind it
            ripe = self.ripe.get(tp) == offset
            if ripe:
                del self.ripe[tp]
            try:
                headers = _headers(msg)
                wake = read_wake_up(headers, self.expiry, now)
                until = release_at(wake, self.delays[topic], _produced_at(msg), now)
                if until > now and not ripe:
                    self._hold(tp, offset, until)
                    continue
                if wake.due_at <= now:
                    target, out_headers = wake.target, headers
                else:
                    target, out_headers = next_trip(self.settings.topology, wake, headers, now)
            except InvalidWakeUp as exc:
                poison.append(poison_of(msg, exc.code, str(exc)))
                done.append(msg)
                continue
            on_refusal = _refusal_into(refused, msg, "the expiry topic" if target == self.expiry
                                       else f"the delay tier {target}")
            err = produce_or_refusal(self.producer, target, key=msg.key(), value=msg.value(),
                                     headers=out_headers, on_delivery=self.delivery.or_refused(on_refusal))
            if err is not None:
                on_refusal(err)
            self.producer.poll(0)
            sent[id(msg)] = target
            done.append(msg)
        if not done:
            return
        self.delivery.flush(self.producer)
        poison += [poison_of(m, "forward_refused", why) for m, why in refused]
        send_poison(self.producer, self.codec, self.delivery, self.settings.topology.dlq, poison, now,
                    self.budget)
        commit_offsets(self.consumer, self.owned, done)
        for refused_msg, _ in refused:
            sent.pop(id(refused_msg), None)
        self.forwarded += sum(1 for target in sent.values() if target == self.expiry)
        self.trips += sum(1 for target in sent.values() if target != self.expiry)
        self.dead_lettered += len(poison)

    def _hold(self, tp: tuple[str, int], offset: int, due: datetime) -> None:
        """Pause the partition and rewind it to the held record (pre-fetched records are dropped)."""
        part = TopicPartition(tp[0], tp[1], offset)
        self.consumer.pause([part])
        self.consumer.seek(part)
        self.held[tp] = (offset, due)

    def _retry_later(self, messages: list[Message], exc: Exception) -> None:
        """The batch failed for a reason outside its records (`is_transient`: the broker or the
        registry away): nothing of it was committed, so its partitions are rewound to the batch's
        first offsets, any hold taken in it released, and it is retried after the outage's backoff.
        Records already forwarded come again (at least once; the processor absorbs duplicates)."""
        rewind_and_back_off(self.consumer, self.owned, messages, exc, self.outage, self.stop,
                            release=self._release)

    def _release(self, tp: tuple[str, int]) -> None:
        """Drop the hold on `tp`, if any, and resume it (a rewind replaces the hold's seek)."""
        self.held.pop(tp, None)
        self.consumer.resume([TopicPartition(tp[0], tp[1])])

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)


def _headers(msg: Message) -> Any:
    """A record's headers; headers the client cannot hand over are a bad header, not a crash."""
    try:
        return msg.headers()
    except Exception as exc:
        raise InvalidWakeUp("invalid_header", f"headers unreadable: {type(exc).__name__}") from None


def _produced_at(msg: Message) -> datetime | None:
    """When a record was produced (its timestamp), or None when it has none a datetime holds."""
    kind, millis = msg.timestamp()
    if kind == TIMESTAMP_NOT_AVAILABLE or millis < 0:
        return None
    try:
        return datetime.fromtimestamp(millis / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _refusal_into(refused: list[tuple[Message, str]], msg: Message, where: str
                  ) -> Callable[[KafkaError], None]:
    """Where the refusal of the record sent on for `msg` (to `where`) goes: into `refused`, with why."""
    def refusal(err: KafkaError) -> None:
        refused.append((msg, f"{where} refused the record: {err.str()}"))
    return refusal
