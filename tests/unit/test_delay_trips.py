"""Delay-tier trips without a broker: a record leaves its tier at its due time or after the tier's
delay, whichever comes first, so no record waits in a tier longer than its delay, whatever is
ahead of it; a long wait makes trips through the declared tiers, within the hop limit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.delays import (
    DUE_AT_HEADER,
    HOPS_HEADER,
    TARGET_HEADER,
    InvalidWakeUp,
    WakeUp,
    delay_record,
    due_header,
    hop_limit,
    next_trip,
    read_wake_up,
    release_at,
)
from lapse.kernel.ledger import LATEST_DUE_AHEAD
from tests.fixtures.topology import repo_topology, tier_covering

TOPOLOGY = repo_topology()
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
DELAYS = {tier.topic: tier.delay_s for tier in TOPOLOGY.tiers}


def wake(due: datetime, hops: int = 0) -> WakeUp:
    return WakeUp(due, TOPOLOGY.expiry, hops)


def test_a_record_leaves_at_its_due_time_or_after_its_tiers_delay_whichever_is_first():
    tier = TOPOLOGY.tiers[0]
    soon, later = NOW + timedelta(seconds=2), NOW + timedelta(days=7)
    assert release_at(wake(soon), tier.delay_s, NOW, NOW) == soon
    assert release_at(wake(later), tier.delay_s, NOW, NOW) == NOW + timedelta(seconds=tier.delay_s)
    # a timestamp missing or in the future (a skewed or hostile producer) counts as now
    for produced in (None, NOW + timedelta(days=365)):
        assert release_at(wake(later), tier.delay_s, produced, NOW) == NOW + timedelta(seconds=tier.delay_s)


def test_the_next_trip_goes_to_the_tier_that_fits_the_remaining_wait_with_one_more_hop():
    headers = [due_header(NOW + timedelta(days=7)), (TARGET_HEADER, TOPOLOGY.expiry.encode()),
               (HOPS_HEADER, b"3"), ("trace", b"t")]
    topic, out = next_trip(TOPOLOGY, wake(NOW + timedelta(days=7), 3), headers, NOW)
    assert topic == TOPOLOGY.tiers[-1].topic
    assert sorted(out) == sorted([due_header(NOW + timedelta(days=7)), (TARGET_HEADER, TOPOLOGY.expiry.encode()),
                                  (HOPS_HEADER, b"4"), ("trace", b"t")])
    topic, _ = next_trip(TOPOLOGY, wake(NOW + timedelta(seconds=100)), [], NOW)
    assert topic == tier_covering(TOPOLOGY, 100)


def test_a_record_at_the_hop_limit_goes_on_no_further_trip():
    limit = hop_limit(TOPOLOGY.tiers)
    with pytest.raises(InvalidWakeUp) as caught:
        next_trip(TOPOLOGY, wake(NOW + timedelta(days=7), limit), [], NOW)
    assert caught.value.code == "hop_limit" and str(caught.value).startswith(HOPS_HEADER)


@pytest.mark.parametrize("wait", [timedelta(seconds=2), timedelta(minutes=45), timedelta(days=7),
                                  LATEST_DUE_AHEAD - timedelta(minutes=1)])
def test_every_accepted_wait_arrives_on_time_in_trips_no_longer_than_their_tier(wait):
    """Follow one record from where a processor puts it to the expiry topic, each hop taking the
    tier's whole allowance: it arrives at its due time, each stay within its tier's delay, and
    within the hop limit (a wait at the far edge of the window too)."""
    due = NOW + wait
    topic, _ = delay_record(TOPOLOGY, due, NOW)
    produced, hops = NOW, 0
    while True:
        left = release_at(wake(due, hops), DELAYS[topic], produced, produced)
        assert left - produced <= timedelta(seconds=DELAYS[topic])
        if due <= left:
            break
        topic, _ = next_trip(TOPOLOGY, wake(due, hops), [], left)
        produced, hops = left, hops + 1
    assert left == due and hops <= hop_limit(TOPOLOGY.tiers)
    if wait == timedelta(days=7):
        assert hops == 7 * 24 - 1  # 168 stays of an hour on the longest tier: the first and 167 trips


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(-60_000, 30 * 86_400_000)), min_size=1, max_size=50))
def test_nothing_waits_in_a_tier_partition_longer_than_the_tiers_delay_whatever_is_ahead(records):
    """A partition's records in produce order, with any due times: the consumer takes them in
    offset order, each no earlier than its release, so one leaves at the latest release so far.
    That is never later than its own produce time plus the tier's delay."""
    delay_s = TOPOLOGY.tiers[0].delay_s
    produced = NOW
    gone = NOW - timedelta(days=1)  # when the record ahead left
    for gap_ms, due_in_ms in records:
        produced += timedelta(milliseconds=gap_ms)
        due = produced + timedelta(milliseconds=due_in_ms)
        gone = max(gone, release_at(wake(due), delay_s, produced, produced))
        assert gone <= produced + timedelta(seconds=delay_s)


@pytest.mark.parametrize(("hops", "code"), [([b"x1"], "invalid_header"), ([b"1" * 10], "invalid_header"),
                                             ([b"1", b"2"], "duplicate_header")])
def test_a_hop_count_that_is_not_one_count_is_refused_naming_the_header(hops, code):
    headers = [(DUE_AT_HEADER, b"1764504000000"), *((HOPS_HEADER, h) for h in hops)]
    with pytest.raises(InvalidWakeUp) as caught:
        read_wake_up(headers, TOPOLOGY.expiry, NOW)
    assert caught.value.code == code and str(caught.value).startswith(HOPS_HEADER)


def test_a_missing_hop_count_is_zero():
    assert read_wake_up([(DUE_AT_HEADER, b"1764504000000")], TOPOLOGY.expiry, NOW).hops == 0
    assert read_wake_up([(DUE_AT_HEADER, b"1764504000000"), (HOPS_HEADER, b"12")], TOPOLOGY.expiry, NOW).hops == 12
