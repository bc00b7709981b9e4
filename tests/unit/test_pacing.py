"""A route's pacing as arithmetic (lapse/kernel/limits/pacing.py): whatever the workers ask and
when, the call slots granted are never closer than the rate allows nor before a Retry-After ends;
a 429 halves the rate once per halving, down to a floor; the rate climbs back to the declared one."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.limits.pacing import (
    DECREASE,
    FLOOR_SHARE,
    HORIZON_S,
    RECOVERY_PER_S,
    RouteState,
    lowered,
    lowers,
    rate_now,
    schedule,
)

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def state(rate: float = 100.0, **changes) -> RouteState:
    return replace(RouteState(rate, rate, T0, T0), **changes)


@given(rate=st.floats(1, 2000), asks=st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 50)), min_size=1,
                                                 max_size=60))
def test_slots_granted_to_any_workers_at_any_times_never_exceed_the_rate(rate, asks):
    """Workers ask one after another (the row's lock orders them), each at its own time for its
    own number of calls: the slots handed out are at least 1/rate apart, none is before its ask,
    and no second of them holds more than the rate allows."""
    route, now, slots = state(rate), T0, []
    for gap, want in asks:
        now += timedelta(seconds=gap)
        plan = schedule(route, now, want)
        granted = plan.slots()
        assert all(s >= now for s in granted) and len(granted) <= want
        assert all(s <= now + timedelta(seconds=HORIZON_S) for s in granted)
        slots += granted
        route = replace(route, next_at=plan.next_at, rate_per_s=plan.rate_per_s, rate_at=now)
    times = [(s - T0).total_seconds() for s in slots]
    assert all(b - a >= 1 / rate - 1e-6 for a, b in pairwise(times))
    for start in times:  # any one-second window from a slot holds at most rate + 1 of them
        assert sum(start <= t < start + 1 for t in times) <= rate + 1


@given(block_s=st.floats(0.1, 3600), want=st.integers(1, 20))
def test_no_slot_before_a_retry_after_ends(block_s, want):
    blocked = state(blocked_until=T0 + timedelta(seconds=block_s))
    plan = schedule(blocked, T0, want)
    if block_s > HORIZON_S:
        assert plan.count == 0 and plan.wait_until is not None and plan.next_at == T0
    else:
        assert plan.count >= 1 and plan.first == blocked.blocked_until


def test_a_burst_of_429s_halves_the_rate_once_and_the_rate_climbs_back():
    route = state(200.0)
    assert lowers(route, T0) and lowered(route, T0) == 200 * DECREASE
    after = replace(route, rate_per_s=lowered(route, T0), rate_at=T0, lowered_at=T0)
    # Calls paced before the halving say nothing new; one paced after it halves again.
    assert not lowers(after, T0 - timedelta(milliseconds=5))
    assert lowers(after, T0 + timedelta(milliseconds=5))
    # Additive recovery: RECOVERY_PER_S of the declared rate each second, up to the declared rate.
    assert rate_now(after, T0 + timedelta(seconds=2)) == 100 + 200 * RECOVERY_PER_S * 2
    assert rate_now(after, T0 + timedelta(hours=1)) == 200
    # Time under a Retry-After regains nothing.
    held = replace(after, blocked_until=T0 + timedelta(seconds=30))
    assert rate_now(held, T0 + timedelta(seconds=30)) == 100
    # Never below the floor, however many halvings.
    floor = replace(route, rate_per_s=200 * FLOOR_SHARE)
    assert lowered(floor, T0) == 200 * FLOOR_SHARE
