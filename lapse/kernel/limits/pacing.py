"""The arithmetic of a route's rate, apart from any database: call slots handed out one after
another at the route's rate (a virtual schedule, GCRA), and the rate itself, halved by a 429 and
climbing back additively. docs/design/limits.md argues the constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

DECREASE = 0.5  # a 429 multiplies the route's rate by this
RECOVERY_PER_S = 0.05  # the share of the declared rate regained per second without a 429: half to full in 10 s
FLOOR_SHARE = 0.01  # the rate never falls below this share of the declared one
HORIZON_S = 0.25  # a grant books call slots at most this far ahead of the database's now


@dataclass(frozen=True)
class RouteState:
    """A route's row as a grant reads it: the declared and the current rate, when the current one
    was set, the next free slot, the last halving and the end of a Retry-After."""

    ceiling_per_s: float
    rate_per_s: float
    rate_at: datetime
    next_at: datetime
    lowered_at: datetime | None = None
    blocked_until: datetime | None = None


@dataclass(frozen=True)
class Schedule:
    """What a grant hands out: `count` call slots from `first`, `spacing_s` apart (none when the
    route is blocked or booked beyond the horizon: then `wait_until` says when to ask again), and
    the route's next free slot and rate after it."""

    first: datetime
    count: int
    spacing_s: float
    next_at: datetime
    rate_per_s: float
    wait_until: datetime | None = None

    def slots(self) -> list[datetime]:
        return [self.first + timedelta(seconds=i * self.spacing_s) for i in range(self.count)]


def floor_of(ceiling_per_s: float) -> float:
    return ceiling_per_s * FLOOR_SHARE


def rate_now(state: RouteState, now: datetime) -> float:
    """The route's rate at `now`: the current one plus what it regained since it was set (time under
    a Retry-After regains nothing: no call told the route it was welcome), at most the declared."""
    since = max(state.rate_at, state.blocked_until or state.rate_at)
    elapsed = max(0.0, (now - since).total_seconds())
    return min(state.ceiling_per_s, state.rate_per_s + state.ceiling_per_s * RECOVERY_PER_S * elapsed)


def lowered(state: RouteState, now: datetime) -> float:
    """The rate after a 429: the rate at `now` halved, never below the floor."""
    return max(floor_of(state.ceiling_per_s), rate_now(state, now) * DECREASE)


def lowers(state: RouteState, paced_at: datetime) -> bool:
    """Whether a 429 to a call whose slot was granted at `paced_at` lowers the rate: only a call
    paced after the last halving says the halved rate is still too fast (a burst of 429s to calls
    granted at the old rate halves it once)."""
    return state.lowered_at is None or paced_at >= state.lowered_at


def schedule(state: RouteState, now: datetime, want: int, horizon_s: float = HORIZON_S) -> Schedule:
    """Up to `want` call slots at the route's rate at `now`, from its next free slot (never before
    now or the end of a Retry-After), within `horizon_s` of now."""
    rate = rate_now(state, now)
    spacing = 1.0 / rate
    start = max(state.next_at, now, state.blocked_until or now)
    ahead = (start - now).total_seconds()
    if ahead > horizon_s or want < 1:
        wait = start - timedelta(seconds=horizon_s) if ahead > horizon_s else now
        return Schedule(start, 0, spacing, state.next_at, rate, wait_until=wait)
    count = min(want, math.floor((horizon_s - ahead) * rate) + 1)
    return Schedule(start, count, spacing, start + timedelta(seconds=count * spacing), rate)
