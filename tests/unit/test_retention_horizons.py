"""The horizon arithmetic of retention: a derived horizon is the topic's retention plus the
reconciler's grace; a configured one at least that is kept, a shorter one refused in one line;
dead letters are never kept shorter than applied rows; a topic that keeps records forever keeps its
rows forever; a topic without a retention cannot be derived from and is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.settings import load_settings
from lapse.retention.horizons import HorizonRefused, horizons, horizons_from_settings
from tests.fixtures.topology import repo_topology

RETENTION_MS = st.integers(min_value=0, max_value=10 * 365 * 86_400_000)
GRACE_S = st.floats(min_value=0, max_value=86_400, allow_nan=False)
SECONDS = st.floats(min_value=1, max_value=20 * 365 * 86_400.0, allow_nan=False)


def make(expiry_ms: int | str | None, dlq_ms: int | str | None, grace_s: float, **configured):
    return horizons(expiry_topic="lapse.expiry", expiry_retention_ms=None if expiry_ms is None else str(expiry_ms),
                    dlq_topic="lapse.dlq", dlq_retention_ms=None if dlq_ms is None else str(dlq_ms),
                    grace_s=grace_s, outbox_horizon_s=configured.pop("outbox_horizon_s", 86_400.0), **configured)


@given(RETENTION_MS, RETENTION_MS, GRACE_S)
def test_derived_horizons_are_retention_plus_grace_and_dead_letters_never_shorter(expiry_ms, dlq_ms, grace_s):
    h = make(expiry_ms, dlq_ms, grace_s)
    assert h.settled.seconds == expiry_ms / 1000 + grace_s
    assert h.dead_letters.seconds == max(dlq_ms / 1000 + grace_s, h.settled.seconds)
    assert h.transitions.seconds == h.settled.seconds
    assert "lapse.expiry retention" in h.settled.reason and "reconciler grace" in h.settled.reason


@given(RETENTION_MS, GRACE_S, SECONDS)
def test_a_configured_ledger_horizon_shorter_than_derived_is_refused_else_kept(expiry_ms, grace_s, configured):
    floor = expiry_ms / 1000 + grace_s
    if configured < floor:
        with pytest.raises(HorizonRefused) as refused:
            make(expiry_ms, expiry_ms, grace_s, ledger_horizon_s=configured)
        assert "\n" not in str(refused.value) and "shorter than" in str(refused.value)
    else:
        h = make(expiry_ms, expiry_ms, grace_s, ledger_horizon_s=configured)
        assert h.settled.seconds == configured
        assert h.dead_letters.seconds is not None and h.dead_letters.seconds >= configured


@given(RETENTION_MS, RETENTION_MS, GRACE_S, SECONDS)
def test_a_configured_dead_letter_horizon_is_refused_below_its_floor(expiry_ms, dlq_ms, grace_s, configured):
    floor = max(expiry_ms, dlq_ms) / 1000 + grace_s
    if configured < floor:
        with pytest.raises(HorizonRefused):
            make(expiry_ms, dlq_ms, grace_s, dead_letter_horizon_s=configured)
    else:
        assert make(expiry_ms, dlq_ms, grace_s, dead_letter_horizon_s=configured).dead_letters.seconds == configured


@given(GRACE_S, SECONDS)
def test_a_topic_kept_forever_keeps_its_rows_forever_and_refuses_any_horizon(grace_s, configured):
    h = make(-1, 1000, grace_s)
    assert h.settled.seconds is None and h.dead_letters.seconds is None  # never shorter than applied rows
    assert h.settled.cutoff(datetime.now(UTC)) is None and "forever" in h.settled.reason
    with pytest.raises(HorizonRefused):
        make(-1, 1000, grace_s, ledger_horizon_s=configured)


@given(SECONDS, st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)))
def test_a_cutoff_is_now_less_the_horizon(seconds, now):
    h = make(0, 0, 0, ledger_horizon_s=seconds)
    assert h.settled.cutoff(now) == now - timedelta(seconds=seconds)


@pytest.mark.parametrize("value", [None, "soon", "1.5"])
def test_a_retention_that_is_missing_or_not_a_whole_number_is_refused(value):
    with pytest.raises(HorizonRefused, match=r"lapse\.expiry"):
        make(value, 1000, 0)


def test_the_packaged_topics_file_gives_fourteen_days_and_the_grace():
    h = horizons_from_settings(load_settings(), repo_topology())
    assert h.settled.seconds == 14 * 86_400 + 300
    assert h.dead_letters.seconds == 90 * 86_400 + 300
    assert h.settled.reason == "lapse.expiry retention 14d + reconciler grace 5m"
    assert h.outbox.seconds == 86_400
