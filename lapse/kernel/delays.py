"""Delay tiers: choosing one for work that is not due yet (retries and early wake-ups), and
reading a wake-up's headers back when a tier consumer gets it.

A record waits in the smallest tier whose delay covers the wait; the tier consumer holds it
until the due time in its `lapse-due-at` header, then forwards it to the expiry topic, the only
place `lapse-target` may name. Headers are outside input to the tier consumer: `read_wake_up`
checks them (UTF-8, length, range, one value each) and says what is wrong with a bad one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from lapse.kernel.ledger import safe_text, time_problem
from lapse.kernel.topology import DelayTier, Topology

DUE_AT_HEADER = "lapse-due-at"
TARGET_HEADER = "lapse-target"

# A record's headers as confluent-kafka hands them over: a list of (key, value) pairs, or a mapping.
RecordHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]

# `lapse-due-at`: epoch milliseconds in ASCII digits (14 digits reach the year 5138: past any due
# time the window allows, within what a datetime holds); `lapse-target`: a Kafka topic name (at
# most 249 characters).
DUE_AT_FORM = re.compile(rb"[0-9]{1,14}")
TARGET_LIMIT = 249


class InvalidWakeUp(ValueError):
    """A delay-tier record whose headers cannot be acted on. `code` names the kind of problem
    (missing_header, invalid_header, duplicate_header, refused_target); the message names the
    header and what is wrong with it."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class WakeUp:
    """What a delay-tier record's headers say: when it is due, and the topic to forward it to."""

    due_at: datetime
    target: str


def choose_tier(tiers: Sequence[DelayTier], wait_seconds: float) -> DelayTier:
    """The smallest tier whose delay is at least `wait_seconds`, else the longest tier.

    A wait longer than the longest tier makes more than one trip: the tier forwards it when its
    own delay has passed and the processor sends it back until the due time is reached."""
    if not tiers:
        raise ValueError("no delay tiers declared in topics.yaml (topics with delay_seconds)")
    for tier in tiers:
        if tier.delay_s >= wait_seconds:
            return tier
    return tiers[-1]


def due_header(due_at: datetime) -> tuple[str, bytes]:
    return DUE_AT_HEADER, str(int(due_at.timestamp() * 1000)).encode()


def parse_due(headers: RecordHeaders | None) -> datetime | None:
    """The `lapse-due-at` time of a record's headers, or None when it is missing or not epoch
    milliseconds (`read_wake_up` says why)."""
    values = _values(headers, DUE_AT_HEADER)
    if not values or values[0] is None or not DUE_AT_FORM.fullmatch(values[0]):
        return None
    return datetime.fromtimestamp(int(values[0]) / 1000, UTC)


def read_wake_up(headers: RecordHeaders | None, expiry_topic: str, now: datetime) -> WakeUp:
    """The wake-up a delay-tier record's headers describe, checked: `lapse-due-at` present, once,
    epoch milliseconds within the due-time window; `lapse-target`, when present, once and naming
    `expiry_topic` (a missing one means that topic). Raises InvalidWakeUp otherwise."""
    due_raw = _one(headers, DUE_AT_HEADER)
    if due_raw is None:
        raise InvalidWakeUp("missing_header", f"{DUE_AT_HEADER}: missing")
    if not DUE_AT_FORM.fullmatch(due_raw):
        raise InvalidWakeUp("invalid_header", f"{DUE_AT_HEADER}: {_shown(due_raw)} is not epoch "
                            "milliseconds (1 to 14 ASCII digits)")
    due_at = datetime.fromtimestamp(int(due_raw) / 1000, UTC)
    problem = time_problem(due_at, now)
    if problem is not None:
        raise InvalidWakeUp("invalid_header", f"{DUE_AT_HEADER}: {problem}")
    target_raw = _one(headers, TARGET_HEADER)
    if target_raw is None:
        return WakeUp(due_at, expiry_topic)
    if len(target_raw) > TARGET_LIMIT:
        raise InvalidWakeUp("invalid_header", f"{TARGET_HEADER}: {len(target_raw)} bytes, longer than "
                            f"any topic name ({TARGET_LIMIT})")
    try:
        target = target_raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidWakeUp("invalid_header", f"{TARGET_HEADER}: not UTF-8: {_shown(target_raw)}") from None
    if target != expiry_topic:
        raise InvalidWakeUp("refused_target", f"{TARGET_HEADER}: {safe_text(target, 80)!r} is not the "
                            f"expiry topic {expiry_topic!r}; a delay tier forwards nowhere else")
    return WakeUp(due_at, target)


def _values(headers: RecordHeaders | None, name: str) -> list[bytes | None]:
    """Every value of header `name`, as bytes (None for a header without a value)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    values: list[bytes | None] = []
    for key, value in pairs:
        if key == name:
            values.append(value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value)
    return values


def _one(headers: RecordHeaders | None, name: str) -> bytes | None:
    """The one value of header `name` (None when it is missing or empty); raises InvalidWakeUp
    when it is repeated with different values."""
    values = _values(headers, name)
    if len(set(values)) > 1:
        raise InvalidWakeUp("duplicate_header", f"{name}: given {len(values)} times with different values")
    return (values[0] or None) if values else None


def _shown(raw: bytes) -> str:
    """A header value as a reason may quote it: its first bytes, escaped."""
    return repr(raw[:40]) + ("…" if len(raw) > 40 else "")


def delay_record(topology: Topology, due_at: datetime, now: datetime) -> tuple[str, list[tuple[str, bytes]]]:
    """Where a record not due before `due_at` waits: (delay topic, headers for the tier consumer,
    which forwards it to the expiry topic when due).

    Producers' `not_before` and the processors' retries and early wake-ups all use this."""
    tier = choose_tier(topology.tiers, (due_at - now).total_seconds())
    return tier.topic, [due_header(due_at), (TARGET_HEADER, topology.expiry.encode())]
