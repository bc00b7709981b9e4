"""Decoding a consumed batch: good records become ExpiryEvents, bad ones become poison.

Poison is anything no ledger row can be made for: undecodable bytes, an unknown schema, missing
fields, a malformed op key, an unknown kind. It is dead-lettered with its reason; it never stops
the partition.
"""

from __future__ import annotations

from dataclasses import dataclass

from lapse.kernel.codec import Codec, DecodeError
from lapse.kernel.ledger import ExpiryEvent, InvalidEvent


class UnknownKind(InvalidEvent):
    code = "unknown_kind"


@dataclass(frozen=True, slots=True)
class Poison:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list
    reason_code: str
    reason: str


def decode_batch(messages, codec: Codec, kinds) -> tuple[list[ExpiryEvent], dict, list[Poison]]:
    """Split consumed messages into (events, positions by op key, poison)."""
    events: list[ExpiryEvent] = []
    positions: dict[str, tuple[str, int, int]] = {}
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
        positions[event.op_key] = (msg.topic(), msg.partition(), msg.offset())
    return events, positions, poison


def _poison(msg, code: str, reason: str) -> Poison:
    return Poison(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(),
                  list(msg.headers() or []), code, reason)
