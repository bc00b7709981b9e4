"""Choosing a delay tier for work that is not due yet (retries and early wake-ups).

A record waits in the smallest tier whose delay covers the wait; the tier consumer holds it
until the due time in its `lapse-due-at` header, then forwards it to `lapse.expiry`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from lapse.kernel.topology import DelayTier, Topology

DUE_AT_HEADER = "lapse-due-at"
TARGET_HEADER = "lapse-target"

# A record's headers as confluent-kafka hands them over: a list of (key, value) pairs, or a mapping.
RecordHeaders = Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None]


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
    """The `lapse-due-at` time of a record's headers (list of (key, bytes)), or None."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    for key, value in pairs:
        if key == DUE_AT_HEADER and value:
            try:
                return datetime.fromtimestamp(int(value) / 1000, UTC)
            except ValueError:
                return None
    return None


def delay_record(topology: Topology, due_at: datetime, now: datetime) -> tuple[str, list[tuple[str, bytes]]]:
    """Where a record not due before `due_at` waits: (delay topic, headers for the tier consumer,
    which forwards it to the expiry topic when due).

    Producers' `not_before` and the processors' retries and early wake-ups all use this."""
    tier = choose_tier(topology.tiers, (due_at - now).total_seconds())
    return tier.topic, [due_header(due_at), (TARGET_HEADER, topology.expiry.encode())]
