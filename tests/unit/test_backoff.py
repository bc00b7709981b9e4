"""The retry backoff proven (processors/failures.py): every wait lies in the upper half of its
nominal value min(cap, base * 2**tries), so waits grow exponentially and stop at the cap; the
jitter spreads the waits of one try over that half; operations that failed together retry apart.
Each of these fails when the jitter is removed (a constant delay) or the cap is (checked by hand
when they were written: see docs/design/limits.md)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import Column, Integer, MetaData, Table

from lapse.kernel.kinds import CleanupKind
from lapse.processors.failures import (
    RATE_LIMITED,
    TEMPORARY,
    Deferrals,
    EffectFailure,
    backoff_seconds,
    decide,
)

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
_table = Table("t", MetaData(), Column("id", Integer, primary_key=True))
KIND = CleanupKind(name="k", table=_table, id_column=_table.c.id, tenant_column=_table.c.id,
                   due_column=_table.c.id, still_eligible=_table.c.id.is_not(None), parse_subject=int,
                   max_attempts=100, retry_base_s=2.0, retry_cap_s=600.0, rate_limited_for_s=86_400.0)
BASES = st.floats(0.01, 100)
TRIES = st.integers(0, 2000)


def nominal(kind: CleanupKind, tries: int) -> float:
    return min(kind.retry_cap_s, kind.retry_base_s * 2.0 ** min(tries, 64))


@given(base=BASES, cap_factor=st.floats(1, 10_000), tries=TRIES, seed=st.integers(0, 2**32))
def test_every_wait_is_in_the_upper_half_of_its_nominal_value_which_the_cap_bounds(base, cap_factor, tries, seed):
    kind = replace(KIND, retry_base_s=base, retry_cap_s=base * cap_factor)
    wait = backoff_seconds(kind, tries, random.Random(seed))
    assert nominal(kind, tries) / 2 <= wait <= nominal(kind, tries) <= kind.retry_cap_s


@given(base=BASES, cap_factor=st.floats(1, 10_000), tries=TRIES, seed=st.integers(0, 2**32))
def test_the_waits_of_one_try_spread_over_the_upper_half(base, cap_factor, tries, seed):
    kind = replace(KIND, retry_base_s=base, retry_cap_s=base * cap_factor)
    rng = random.Random(seed)
    waits = [backoff_seconds(kind, tries, rng) for _ in range(200)]
    # 200 uniform draws over half the nominal value span most of it; a constant delay spans nothing.
    assert max(waits) - min(waits) >= 0.3 * nominal(kind, tries)
    assert len(set(waits)) >= 190


@given(seed=st.integers(0, 2**32))
def test_rate_limited_tries_without_retry_after_back_off_on_their_count_not_the_attempt(seed):
    """A 429 without Retry-After burns no attempt, so the count of rate-limited tries drives its
    waits: they double from the base to the cap, each in the upper half of its nominal value."""
    rng = random.Random(seed)
    failure = EffectFailure(RATE_LIMITED, "HTTP 429", slow_down=True)
    waits = []
    for tries in range(14):
        decision = decide(KIND, 3, failure, NOW, rng, Deferrals(tries, NOW - timedelta(seconds=1)))
        assert decision.retry and decision.attempt == 3 and decision.due_at is not None
        waits.append((decision.due_at - NOW).total_seconds())
    for tries, wait in enumerate(waits):
        assert nominal(KIND, tries) / 2 - 0.001 <= wait <= nominal(KIND, tries)
    assert waits[-1] >= KIND.retry_cap_s / 2 and max(waits) <= KIND.retry_cap_s


def test_operations_that_fail_together_retry_apart():
    """500 operations failing in the same batch at the same attempt (a far side down for a moment)
    come back spread over their window: no second holds more than a fifth of them (uniform over the
    8 s window of this try, 8 to 16 s, expects an eighth); with a constant delay they would all come
    at once."""
    rng = random.Random(7)
    for failure, attempt in ((EffectFailure(TEMPORARY, "HTTP 503"), 2),
                             (EffectFailure(RATE_LIMITED, "HTTP 429", slow_down=True), 0)):
        due = [decide(KIND, attempt, failure, NOW, rng, Deferrals(3, NOW)).due_at for _ in range(500)]
        per_second = Counter(int((d - NOW).total_seconds()) for d in due if d is not None)
        assert len(due) == 500 and max(per_second.values()) <= 100, per_second
        assert len(per_second) >= 8
