"""Choosing a delay tier for work that is not due yet (retries and early wake-ups).

A record waits in the smallest tier whose delay covers the wait; the tier consumer holds it
until the due time in its `lapse-due-at` header, then forwards it to `lapse.expiry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

DUE_AT_HEADER = "lapse-due-at"
TARGET_HEADER = "lapse-target"


def choose_tier(tiers: Sequence[tuple[str, int]], wait_seconds: float) -> str:
    """The smallest tier whose delay is at least `wait_seconds`, else the longest tier.

    A wait longer than the longest tier makes more than one trip: the tier forwards it when its
    own delay has passed and the processor sends it back until the due time is reached."""
    if not tiers:
        raise ValueError("no delay tiers declared in topics.yaml (topics with delay_seconds)")
    for name, delay in tiers:
        if delay >= wait_seconds:
            return name
    return tiers[-1][0]


def due_header(due_at: datetime) -> tuple[str, bytes]:
    return DUE_AT_HEADER, str(int(due_at.timestamp() * 1000)).encode()
