"""Delay tiers: choosing one for work that is not due yet (retries and early wake-ups), reading a
wake-up's headers back when a tier consumer gets it, and deciding where it goes next.

A tier holds a record at most its own delay. A record's due time stays in its `lapse-due-at`
header; the record leaves its tier at its release time, the earlier of its due time and its head
time (when it was produced plus the tier's delay, `release_at`). Then the tier consumer forwards
it to the expiry topic if it is due, else re-produces it to the tier that fits the remaining wait
(`choose_tier`: the shortest tier covering it, else the longest), counting trips in `lapse-hops`.
A wait longer than the longest tier therefore makes several trips of at most that tier's delay.

Why trips and not the ledger: the tier consumer pauses a partition at its first record not yet
released, so a record waits behind its predecessors. When every record of a tier is released no
later than its produce time plus the tier's delay, and a partition's records are in produce order,
each record ahead of a record R is released by R's own produce time plus the delay: nothing in a
tier waits longer than that tier's delay, whatever waits longer behind or ahead of it. Keeping long
waits in the ledger for the sweep to emit would do the same, but only for work with a ledger row:
producers' `not_before` events have none before they reach a processor, and the delay worker
reads no database. Trips keep the wake-up mechanism owning timing alone, cost one small record
per longest-tier delay per long wait (a 7-day wait on a 1 h longest tier: 167 trips), and need no
new table, query or sweep. The hop count is a safety bound (`hop_limit`), derived from the longest
wait Lapse accepts (`LATEST_DUE_AHEAD`): a record past it is dead-lettered, never looped forever.
The produce time is the record's timestamp; one missing or ahead of the tier consumer's clock counts
as the time it is read, so a skewed or hostile timestamp cannot hold a partition longer either.

Order: a partition's records leave in offset order (the consumer holds the partition at its first
record not released). Records due together are forwarded in that order, with their key, so to the
same expiry partition in the same order (the producer is idempotent). A record re-produced for
another trip does overtake later records of its key that fall due sooner; that is the order of due
times, and the processor decides against the ledger row, not the order of wake-ups (an early one is
sent back, a stale one absorbed).

Headers are outside input to the tier consumer: `read_wake_up` checks them (UTF-8, length, range,
one value each) and says what is wrong with a bad one; only the expiry topic may be named as
`lapse-target`, and a next trip goes only to a tier of the topology.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from lapse.kernel.ledger import LATEST_DUE_AHEAD, time_problem
from lapse.kernel.text import one_line
from lapse.kernel.topology import DelayTier, Topology

DUE_AT_HEADER = "lapse-due-at"
TARGET_HEADER = "lapse-target"
HOPS_HEADER = "lapse-hops"
OWN_HEADERS = (DUE_AT_HEADER, TARGET_HEADER, HOPS_HEADER)

# A record's headers as confluent-kafka hands them over: a list of (key, value) pairs, or a mapping.
RecordHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]

# `lapse-due-at`: epoch milliseconds in ASCII digits (14 digits reach the year 5138: past any due
# time the window allows, within what a datetime holds); `lapse-target`: a Kafka topic name (at
# most 249 characters); `lapse-hops`: the trips made so far, ASCII digits (9 are far past any
# `hop_limit`).
DUE_AT_FORM = re.compile(rb"[0-9]{1,14}")
HOPS_FORM = re.compile(rb"[0-9]{1,9}")
TARGET_LIMIT = 249


class InvalidWakeUp(ValueError):
    """A delay-tier record whose headers cannot be acted on. `code` names the kind of problem
    (missing_header, invalid_header, duplicate_header, refused_target, hop_limit); the message
    names the header and what is wrong with it."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class WakeUp:
    """What a delay-tier record's headers say: when it is due, the topic to forward it to, and
    how many trips through the tiers it has made."""

    due_at: datetime
    target: str
    hops: int = 0


def choose_tier(tiers: Sequence[DelayTier], wait_seconds: float) -> DelayTier:
    """The smallest tier whose delay is at least `wait_seconds`, else the longest tier.

    A wait longer than the longest tier makes more than one trip: the tier consumer takes it off
    the tier when the tier's delay has passed and re-produces it here, until the due time."""
    if not tiers:
        raise ValueError("no delay tiers declared in topics.yaml (topics with delay_seconds)")
    for tier in tiers:
        if tier.delay_s >= wait_seconds:
            return tier
    return tiers[-1]


def hop_limit(tiers: Sequence[DelayTier]) -> int:
    """The most trips a wake-up may make: twice what the longest accepted wait (`LATEST_DUE_AHEAD`)
    takes on the longest tier (each trip lasts that tier's delay; the factor absorbs clock skew
    between tier consumers), plus one trip per tier. About 351,000 with a 1 h longest tier."""
    longest = max(tier.delay_s for tier in tiers)
    return 2 * math.ceil(LATEST_DUE_AHEAD.total_seconds() / longest) + len(tiers)


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
    `expiry_topic` (a missing one means that topic); `lapse-hops`, when present, once and digits
    (a missing one means 0). Raises InvalidWakeUp otherwise."""
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
    hops_raw = _one(headers, HOPS_HEADER)
    if hops_raw is not None and not HOPS_FORM.fullmatch(hops_raw):
        raise InvalidWakeUp("invalid_header", f"{HOPS_HEADER}: {_shown(hops_raw)} is not a count "
                            "(1 to 9 ASCII digits)")
    hops = int(hops_raw) if hops_raw is not None else 0
    target_raw = _one(headers, TARGET_HEADER)
    if target_raw is None:
        return WakeUp(due_at, expiry_topic, hops)
    if len(target_raw) > TARGET_LIMIT:
        raise InvalidWakeUp("invalid_header", f"{TARGET_HEADER}: {len(target_raw)} bytes, longer than "
                            f"any topic name ({TARGET_LIMIT})")
    try:
        target = target_raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidWakeUp("invalid_header", f"{TARGET_HEADER}: not UTF-8: {_shown(target_raw)}") from None
    if target != expiry_topic:
        raise InvalidWakeUp("refused_target", f"{TARGET_HEADER}: {one_line(target, 80, escape=True)!r} is not the "
                            f"expiry topic {expiry_topic!r}; a delay tier forwards nowhere else")
    return WakeUp(due_at, target, hops)


def release_at(wake: WakeUp, delay_s: int, produced_at: datetime | None, now: datetime) -> datetime:
    """When a record read from a tier of `delay_s` leaves it: at its due time, or at its head time
    (produced plus the tier's delay) when that is earlier. A produce time that is missing or in
    the future (a producer's clock, or a hostile timestamp) counts as `now`, so no record is held
    longer than `delay_s` from when it is read."""
    produced = now if produced_at is None or produced_at > now else produced_at
    return min(wake.due_at, produced + timedelta(seconds=delay_s))


def next_trip(topology: Topology, wake: WakeUp, headers: RecordHeaders | None, now: datetime
              ) -> tuple[str, list[tuple[str, bytes | None]]]:
    """Where a record released from its tier before its due time goes next: (the tier that fits
    the remaining wait, its headers: the record's own others kept, its due time and target, one
    more hop). Raises InvalidWakeUp ("hop_limit") when the record has made `hop_limit` trips."""
    limit = hop_limit(topology.tiers)
    if wake.hops >= limit:
        raise InvalidWakeUp("hop_limit", f"{HOPS_HEADER}: {wake.hops} trips through the delay tiers, "
                            f"the most any wait Lapse accepts takes is {limit}")
    tier = choose_tier(topology.tiers, (wake.due_at - now).total_seconds())
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    kept = [(key, _as_bytes(value)) for key, value in pairs if key not in OWN_HEADERS]
    return tier.topic, [*kept, due_header(wake.due_at), (TARGET_HEADER, topology.expiry.encode()),
                        (HOPS_HEADER, str(wake.hops + 1).encode())]


def _as_bytes(value: str | bytes | None) -> bytes | None:
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value


def _values(headers: RecordHeaders | None, name: str) -> list[bytes | None]:
    """Every value of header `name`, as bytes (None for a header without a value)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    return [_as_bytes(value) for key, value in pairs if key == name]


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
    """Where a record not due before `due_at` waits first: (delay topic, headers for the tier
    consumer, which forwards it to the expiry topic when due or sends it on another trip when
    its tier's delay has passed first).

    Producers' `not_before` and the processors' retries and early wake-ups all use this."""
    tier = choose_tier(topology.tiers, (due_at - now).total_seconds())
    return tier.topic, [due_header(due_at), (TARGET_HEADER, topology.expiry.encode())]
