"""Reading partitions to their ends, for a reader that must see everything (the audit).

A partition is read to its end when partition EOF is reported at or past the high watermark
captured before reading began. EOF is the end of the log as the reader reaches it, right on Apache
Kafka and on the embedded tansu broker, whose ListOffsets answer can be short of the end
(PITFALLS.md); the captured watermark guards against an EOF reported too early. The end is never
guessed from a quiet spell: a partition that makes no progress (no record, no EOF) for `stall_s`
seconds is given up (`PartitionEnd.stalled`), the others are read on, and the reader says what it
could not read (the audit reports it as a gap).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from lapse.readers.offsets import Span


@dataclass
class PartitionEnd:
    """One partition's read: from `start`, `captured` the high watermark asked before reading,
    `position` the next offset to read, `end` where EOF was seen (None: not yet)."""

    topic: str
    partition: int
    start: int
    captured: int
    position: int
    progressed_at: float
    records: int = 0
    end: int | None = None
    stalled: bool = False  # given up: no progress for the stall time before its end
    first_ms: int | None = None  # the timestamp of the first record read
    last_ms: int | None = None  # the timestamp of the last record read

    @property
    def done(self) -> bool:
        return self.end is not None or self.stalled

    @property
    def missing(self) -> int:
        """Offsets in [start, end) that yielded no record: 0 on Lapse's topics, which are neither
        compacted nor written in transactions (so a gap means records were not seen)."""
        return 0 if self.end is None else max(0, self.end - self.start - self.records)


class EndTracker:
    """Where each partition's read stands; fed records and EOF events, it says which partitions
    are done, which stalled, and whether every offset between start and end yielded a record."""

    def __init__(self, spans: list[Span], now: float) -> None:
        self.parts = {(s.topic, s.partition): PartitionEnd(s.topic, s.partition, s.start, s.end, s.start, now)
                      for s in spans}

    @property
    def pending(self) -> list[PartitionEnd]:
        return [p for p in self.parts.values() if not p.done]

    def record(self, topic: str, partition: int, offset: int, now: float, ts_ms: int | None = None) -> bool:
        """A record (with its timestamp) arrived; False when it is not one to count (unknown
        partition, already done, before the start or seen before)."""
        part = self.parts.get((topic, partition))
        if part is None or part.done or offset < part.position:
            return False
        part.position, part.records, part.progressed_at = offset + 1, part.records + 1, now
        if part.first_ms is None:
            part.first_ms = ts_ms
        part.last_ms = ts_ms
        return True

    def eof(self, topic: str, partition: int, offset: int, now: float) -> None:
        """Partition EOF at `offset`: the end, unless it is short of the captured watermark (then
        the partition stays pending until it reaches it)."""
        part = self.parts.get((topic, partition))
        if part is None or part.done:
            return
        if offset >= part.captured and offset >= part.position:  # a short EOF is no progress
            part.end, part.progressed_at = offset, now

    def give_up_stalled(self, now: float, stall_s: float) -> list[PartitionEnd]:
        """Give up the pending partitions that made no progress for `stall_s` seconds; returns them."""
        stalled = [p for p in self.pending if now - p.progressed_at >= stall_s]
        for part in stalled:
            part.stalled = True
        return stalled

    def given_up(self) -> list[PartitionEnd]:
        """The partitions given up before their end, in the order of the spans."""
        return [p for p in self.parts.values() if p.stalled]

    def short(self) -> list[dict[str, Any]]:
        """Partitions read to their end whose offsets did not all yield a record."""
        return [{"topic": p.topic, "partition": p.partition, "read_to": p.position, "end": p.end,
                 "missing": p.missing} for p in self.parts.values() if p.missing]


def read_to_ends(consumer: Consumer, spans: list[Span], tracker: EndTracker, *, stall_s: float,
                 on_message: Callable[[Message], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> Iterator[Message]:
    """Yield every record from each span's start to its partition's end (`tracker` says where
    each stands), by manual assignment; a partition that stalls for `stall_s` seconds before its
    end is given up (`EndTracker.given_up`)."""
    if not spans:
        return
    consumer.assign([TopicPartition(s.topic, s.partition, s.start) for s in spans])
    try:
        while tracker.pending:
            for msg in consumer.consume(500, 0.2):
                now = clock()
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if topic is None or partition is None or offset is None:
                    err = msg.error()
                    if err is not None and err.fatal():
                        raise KafkaException(err)
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        tracker.eof(topic, partition, offset, now)
                    elif err.fatal():
                        raise KafkaException(err)
                    continue
                if tracker.record(topic, partition, offset, now, msg.timestamp()[1]):
                    if on_message is not None:
                        on_message(msg)
                    yield msg
            tracker.give_up_stalled(clock(), stall_s)
    finally:
        consumer.unassign()
