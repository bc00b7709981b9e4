"""Decoding a consumed batch: good records become ExpiryEvents, bad ones become poison.

Decoding is where outside input enters the processor, so every field is checked here
(`ExpiryEvent.from_record`, and the attempt count against the kind's `max_attempts`). Poison is
anything no ledger row can be made for: undecodable bytes, an unknown schema, missing or invalid
fields, a malformed op key. It is dead-lettered with its reason, which names the field at fault;
it never stops the partition, and nothing a record holds raises past this point. An event of a
kind the kinds file does not declare is not poison: its work waits, held, until the kind is
declared again (docs/design/brakes.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import Message

from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import ExpiryEvent, InvalidEvent, InvalidField, Position
from lapse.kernel.logs import get_logger
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.text import one_line
from lapse.kernel.trace_context import traceparent_in

log = get_logger("processor")


@dataclass(frozen=True, slots=True)
class Poison:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[Any]  # (name, bytes) pairs as the consumer returned them
    reason_code: str
    reason: str


def partition_of(msg: Message) -> tuple[str, int]:
    """The (topic, partition) of a consumed record (or of its partition's EOF event)."""
    topic, partition = msg.topic(), msg.partition()
    if topic is None or partition is None:
        raise ValueError("a consumed record without its topic or partition")
    return topic, partition


def position_of(msg: Message) -> Position:
    """The (topic, partition, offset) of a consumed record."""
    offset = msg.offset()
    if offset is None:
        raise ValueError("a consumed record without its offset")
    return (*partition_of(msg), offset)


def decode_batch(messages: list[Message], codec: Codec, kinds: Mapping[str, CleanupKind],
                 now: datetime | None = None) -> tuple[list[ExpiryEvent], dict[str, Position], list[Poison]]:
    """Split consumed messages into (events, positions by op key, poison); `now` (default: the
    clock) places the due-time window."""
    now = now or datetime.now(UTC)  # the window is years wide: minutes of skew do not move it
    events: list[ExpiryEvent] = []
    positions: dict[str, Position] = {}
    poison: list[Poison] = []
    for msg in messages:
        try:
            event = decode_event(msg.value(), codec, kinds, now, carried_traceparent(msg))
        except DecodeError as exc:
            if exc.transient:
                raise  # a registry outage is not bad input: fail the batch, offsets stay put
            poison.append(poison_of(msg, exc.reason, str(exc)))
            continue
        except InvalidEvent as exc:
            poison.append(poison_of(msg, exc.code, str(exc)))
            continue
        except Exception as exc:  # a record must never get further than this: say what it did
            item = poison_of(msg, "undecodable", f"{type(exc).__name__}: {exc}")
            log.error("record failed to decode in an unforeseen way (a bug to report)", extra={
                "partition": item.partition, "offset": item.offset, "error": type(exc).__name__})
            poison.append(item)
            continue
        events.append(event)
        positions[event.op_key] = position_of(msg)
    return events, positions, poison


def decode_event(value: bytes | None, codec: Codec, kinds: Mapping[str, CleanupKind],
                 now: datetime, traceparent: str | None = None) -> ExpiryEvent:
    """The event a record value carries, every field checked, with the record's `traceparent`;
    raises DecodeError or InvalidEvent (whose code and message name the field at fault)."""
    if value is None:
        raise DecodeError("empty", "record has no value (tombstone)")
    event = ExpiryEvent.from_record(codec.decode_expected(EXPIRY_EVENT, value), now, traceparent)
    kind = kinds.get(event.kind)
    if kind is not None and event.attempt > kind.max_attempts:
        raise InvalidField({"attempt": f"{event.attempt} is more than the {kind.max_attempts} attempts "
                                       f"of kind {kind.name!r}"})
    return event


def carried_traceparent(msg: Message) -> str | None:
    """The record's valid `traceparent` header, or None: a malformed one is dropped, never a reason
    to refuse the record."""
    try:
        return traceparent_in(msg.headers())
    except Exception:  # headers the client cannot hand over: the record is judged by its value
        return None


def poison_of(msg: Message, code: str, reason: str) -> Poison:
    """The poison item of a consumed record: its position, bytes and headers, and why."""
    try:
        headers = list(msg.headers() or [])
    except Exception as exc:  # headers the client cannot even hand over: keep a note of it
        headers = [("lapse-unreadable-headers", one_line(str(exc), 200, escape=True).encode())]
    return Poison(*position_of(msg), msg.key(), msg.value(), headers, code, one_line(reason, 2000, escape=True))
