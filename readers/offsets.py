"""Reading topics by manual assignment, and a consumer group's positions: committed offsets,
lag, and operator resets.

Manual readers use a throwaway group id, assign partitions themselves and commit nothing, so an
audit or a lag probe never disturbs the groups it looks at. The end of a partition is the high
watermark captured at the start or partition EOF, whichever comes first (see PITFALLS.md).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime

from confluent_kafka import (
    Consumer,
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from lapse.kernel.kafka_clients import make_admin, make_consumer
from lapse.kernel.ledger import millis
from lapse.kernel.settings import Settings

TIMEOUT_S = 10.0  # a metadata or admin answer; an unreachable broker is reported after this
_COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                       KafkaError.COORDINATOR_NOT_AVAILABLE}


class OffsetsError(Exception):
    """A wrong group, topic or state for the request; str(self) is a one-line message."""


def manual_consumer(settings: Settings) -> Consumer:
    """A consumer that only assigns partitions: a throwaway group id, nothing ever committed.

    A reader of history stops at partition EOF, which the broker reports only after holding an
    empty fetch for `fetch.wait.max.ms` (500 ms by default): 50 ms keeps that off every replay."""
    return make_consumer(settings, f"lapse-manual-{uuid.uuid4().hex[:12]}",
                         **{"enable.auto.commit": False, "enable.partition.eof": True,
                            "fetch.wait.max.ms": 50})


def partitions_of(consumer: Consumer, topic: str) -> list[int]:
    meta = consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise OffsetsError(f"topic {topic} does not exist")
    return sorted(meta.partitions)


def watermarks(consumer: Consumer, topic: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
    """partition → (low, high): the earliest retained offset and the end of the log, asked now."""
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT_S, cached=False)
            for p in partitions}


def offsets_at(consumer: Consumer, topic: str, partitions: list[int], ts: datetime) -> dict[int, int]:
    """partition → first offset with a timestamp at or after `ts`, -1 when none (a hint only)."""
    found = consumer.offsets_for_times([TopicPartition(topic, p, millis(ts)) for p in partitions],
                                       timeout=TIMEOUT_S)
    return {tp.partition: tp.offset for tp in found}


@dataclass(frozen=True)
class Start:
    """Where to read one partition from: its retained offsets [low, high) and `start`, the first
    offset at or after the time asked (low when none was asked, high when no record is that late)."""

    partition: int
    low: int
    high: int
    start: int


def starts(consumer: Consumer, topic: str, since: datetime | None) -> list[Start]:
    """Each partition's Start. Kafka's answer for `since` is a starting hint only (the embedded
    broker answers 0 for every time): a reader still filters records by their timestamp."""
    parts = partitions_of(consumer, topic)
    marks = watermarks(consumer, topic, parts)
    hints = offsets_at(consumer, topic, parts, since) if since else {}
    found = []
    for p in parts:
        low, high = marks[p]
        start = low if since is None else (high if hints[p] < 0 else max(hints[p], low))
        found.append(Start(p, low, high, start))
    return found


@dataclass(frozen=True)
class Span:
    """Offsets [start, end) of one partition to read."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def read_spans(consumer: Consumer, spans: list[Span], *, first_only: bool = False,
               stall_s: float = 60.0, on_message: Callable[[Message], None] | None = None) -> Iterator[Message]:
    """Yield the records of every span in partition order, stopping each partition at its end or at
    partition EOF; with `first_only`, only the first record of each. Raises TimeoutError when
    nothing arrives for `stall_s` seconds."""
    remaining = {(s.topic, s.partition): s.end for s in spans if s.size > 0}
    if not remaining:
        return
    consumer.assign([TopicPartition(s.topic, s.partition, s.start) for s in spans if s.size > 0])
    last = time.monotonic()
    try:
        while remaining:
            batch = consumer.consume(500, 0.5)
            if batch:
                last = time.monotonic()
            elif time.monotonic() - last > stall_s:
                raise TimeoutError(f"no records for {stall_s:.0f}s from {sorted(remaining)[:3]}")
            for msg in batch:
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if topic is None or partition is None:
                    continue
                tp = (topic, partition)
                end = remaining.get(tp)
                if end is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        remaining.pop(tp)
                    elif err.fatal():
                        raise KafkaException(err)
                    continue
                if offset is None:  # only error events lack an offset
                    continue
                if offset >= end:
                    remaining.pop(tp)
                    continue
                if on_message is not None:
                    on_message(msg)
                yield msg
                if first_only or offset + 1 >= end:
                    remaining.pop(tp)
    finally:
        consumer.unassign()


UNBOUNDED = 2**63 - 1  # a span's end when partition EOF alone says where the partition ends


def read_to_end(settings: Settings, topic: str, *, stall_s: float = 60.0) -> Iterator[Message]:
    """Every retained record of `topic`, partition by partition, up to each partition's EOF (the
    end as it is when the reader gets there; not ListOffsets, wrong on the embedded broker), by
    manual assignment with nothing committed. Raises OffsetsError when the topic does not exist."""
    consumer = manual_consumer(settings)
    try:
        parts = partitions_of(consumer, topic)
        lows = {p: low for p, (low, _high) in watermarks(consumer, topic, parts).items()}
        yield from read_spans(consumer, [Span(topic, p, lows[p], UNBOUNDED) for p in parts], stall_s=stall_s)
    finally:
        consumer.close()


def committed(settings: Settings, group: str, topic: str,
              partitions: list[int]) -> dict[tuple[str, int], int | None]:
    """(topic, partition) → the group's committed offset, None when it has none. Asked through a
    consumer carrying the group id that never subscribes: AdminClient.list_consumer_group_offsets
    crashes librdkafka on NOT_COORDINATOR for a group not yet loaded (librdkafka #5040)."""
    consumer = make_consumer(settings, group, **{"enable.auto.commit": False})
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            try:
                found = consumer.committed([TopicPartition(topic, p) for p in partitions],
                                           timeout=TIMEOUT_S)
                break
            except KafkaException as exc:  # the coordinator moves or is still loading
                if exc.args[0].code() not in _COORDINATOR_MOVING or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}


def active_members(admin: AdminClient, group: str) -> tuple[str, int]:
    """The group's state name and member count. The embedded tansu broker reports no members of an
    active group (PITFALLS.md); Apache Kafka reports them."""
    desc = admin.describe_consumer_groups([group], request_timeout=TIMEOUT_S)[group].result()
    return desc.state.name, len(desc.members)


def group_states(settings: Settings, groups: list[str]) -> dict[str, dict[str, object]]:
    """Each group's state name and member count, asked in one request: {"state", "members"}, or
    {"error"} for a group the broker would not describe (no DESCRIBE ACL, coordinator away)."""
    admin = make_admin(settings)
    found: dict[str, dict[str, object]] = {}
    asked, deadline = list(groups), time.monotonic() + TIMEOUT_S
    while asked:
        moving = []
        for group, future in admin.describe_consumer_groups(asked, request_timeout=TIMEOUT_S).items():
            try:
                desc = future.result()
                found[group] = {"state": desc.state.name.lower(), "members": len(desc.members)}
            except KafkaException as exc:
                error = exc.args[0]
                found[group] = {"error": f"{error.name()}: {error.str()}".rstrip(": ")}
                if error.code() in _COORDINATOR_MOVING:  # still loading, or never loaded for an unused group
                    moving.append(group)
        if not moving or time.monotonic() > deadline:
            break
        asked = moving
        time.sleep(0.3)
    return found


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    high: int
    records: int
    seconds: float | None


def group_lag(settings: Settings, group: str, topic: str, now: datetime) -> list[PartitionLag]:
    """Lag of `group` on `topic` per partition: in records (committed vs high watermark), and in
    seconds (age of the record at the committed offset, read by manual assignment)."""
    consumer = manual_consumer(settings)
    try:
        parts = partitions_of(consumer, topic)
        marks = watermarks(consumer, topic, parts)
        done = committed(settings, group, topic, parts)
        spans = []
        for p in parts:
            low, high = marks[p]
            start = max(done.get((topic, p)) or low, low)
            spans.append(Span(topic, p, start, high))
        oldest = {msg.partition(): msg.timestamp()[1]
                  for msg in read_spans(consumer, spans, first_only=True)}
    finally:
        consumer.close()
    now_ms = millis(now)
    return [PartitionLag(topic, s.partition, done.get((topic, s.partition)), s.end, s.size,
                         None if s.partition not in oldest else max(0.0, (now_ms - oldest[s.partition]) / 1000))
            for s in spans]


@dataclass(frozen=True)
class Reset:
    """One partition's move: `old` (None when nothing was committed) → `new`."""

    topic: str
    partition: int
    old: int | None
    new: int


def plan_reset(settings: Settings, group: str, topics: list[str], *,
               to_datetime: datetime | None = None, to_earliest: bool = False,
               shift_by: int | None = None) -> list[Reset]:
    """Where each partition of `topics` would move for the group; nothing is changed.
    New offsets stay within [low watermark, high watermark]."""
    if sum(x is not None and x is not False for x in (to_datetime, to_earliest or None, shift_by)) != 1:
        raise OffsetsError("give exactly one of --to-datetime, --to-earliest, --shift-by")
    if not topics:
        raise OffsetsError(f"no topic to reset for group {group}: name one with --topic")
    consumer = manual_consumer(settings)
    try:
        plan = []
        for name in topics:
            parts = partitions_of(consumer, name)
            marks = watermarks(consumer, name, parts)
            old = committed(settings, group, name, parts)
            at = offsets_at(consumer, name, parts, to_datetime) if to_datetime else {}
            for p in parts:
                low, high = marks[p]
                current = old.get((name, p))
                if to_earliest:
                    new = low
                elif to_datetime is not None:
                    new = at[p] if at[p] >= 0 else high
                else:
                    assert shift_by is not None  # exactly one way to move was checked above
                    new = (low if current is None else current) + shift_by
                plan.append(Reset(name, p, current, min(max(new, low), high)))
        return plan
    finally:
        consumer.close()


def execute_reset(admin: AdminClient, group: str, plan: list[Reset]) -> None:
    """Commit the planned offsets for the group; refuses while the group has members."""
    state, members = active_members(admin, group)
    if members or state not in (ConsumerGroupState.EMPTY.name, ConsumerGroupState.DEAD.name,
                                ConsumerGroupState.UNKNOWN.name):
        raise OffsetsError(f"group {group} is active ({state}, {members} members): stop its "
                           "consumers before resetting offsets")
    tps = [TopicPartition(r.topic, r.partition, r.new) for r in plan]
    request = ConsumerGroupTopicPartitions(group, tps)
    result = admin.alter_consumer_group_offsets([request], request_timeout=TIMEOUT_S)[group].result()
    failed = [tp for tp in result.topic_partitions if tp.error is not None]
    if failed:
        raise OffsetsError(f"offset reset failed for {failed[0].topic}[{failed[0].partition}]: {failed[0].error}")


__all__ = ["OffsetsError", "PartitionLag", "Reset", "Span", "Start", "active_members",
           "committed", "execute_reset", "group_lag", "manual_consumer", "offsets_at",
           "partitions_of", "plan_reset", "read_spans", "read_to_end", "starts", "watermarks"]
