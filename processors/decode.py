"""Decoding a consumed batch: good records become ExpiryEvents, bad ones become poison.

Poison is anything no ledger row can be made for: undecodable bytes, an unknown schema, missing
fields, a malformed op key, an unknown kind. It is dead-lettered with its reason; it never stops
the partition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.kinds import CleanupKind
from lapse.kernel.ledger import ExpiryEvent, InvalidEvent, Position


class UnknownKind(InvalidEvent):
    code = "unknown_kind"


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


def decode_batch(messages: list[Message], codec: Codec, kinds: Mapping[str, CleanupKind]
                 ) -> tuple[list[ExpiryEvent], dict[str, Position], list[Poison]]:
    """Split consumed messages into (events, positions by op key, poison)."""
    events: list[ExpiryEvent] = []
    positions: dict[str, Position] = {}
    poison: list[Poison] = []
    for msg in messages:
        value = msg.value()
        try:
            if value is None:
                raise DecodeError("empty", "record has no value (tombstone)")
            event = ExpiryEvent.from_record(codec.decode_expected("expiry_event", value))
            if event.kind not in kinds:
                raise UnknownKind(f"unknown cleanup kind {event.kind!r}")
        except DecodeError as exc:
            if exc.transient:
                raise  # a registry outage is not bad input: fail the batch, offsets stay put
            poison.append(_poison(msg, exc.reason, str(exc)))
            continue
        except InvalidEvent as exc:
            poison.append(_poison(msg, exc.code, str(exc)))
            continue
        except (KeyError, TypeError) as exc:
            poison.append(_poison(msg, "missing_field", f"missing or wrong field: {exc}"))
            continue
        events.append(event)
        positions[event.op_key] = position_of(msg)
    return events, positions, poison


def _poison(msg: Message, code: str, reason: str) -> Poison:
    return Poison(*position_of(msg), msg.key(), msg.value(), list(msg.headers() or []), code, reason)
