"""How the sweep shares a page across tenants (producers/fair_pages.py): weighted max-min shares
that fill the page, and the page's rows in turns."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.kinds import EligibleRow
from lapse.producers.fair_pages import in_turns, shares

T0 = datetime(2026, 12, 3, tzinfo=UTC)


@given(left=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(1, 5000), min_size=1),
       weights=st.dictionaries(st.sampled_from("abcdefgh"), st.sampled_from([0.5, 1.0, 2.0, 3.0])),
       limit=st.integers(1, 2000))
def test_a_page_is_shared_max_min_by_weight_and_filled(left, weights, limit):
    w = {t: weights.get(t, 1.0) for t in left}
    whole, share = shares(Counter(left), w, limit)
    given_rows = {**{t: left[t] for t in whole}, **share}
    assert set(given_rows) == set(left) and not set(whole) & set(share)
    assert all(1 <= share[t] <= left[t] for t in share)  # at least a row, at most what it has
    assert sum(given_rows.values()) <= limit + len(share)  # within the page, but for a row each
    if share:  # the page is full but for rounding, and the shares follow the weights
        assert sum(given_rows.values()) >= limit - len(share)
        if min(share.values()) > 1:
            per_weight = [share[t] / w[t] for t in share]
            assert max(per_weight) - min(per_weight) <= 2 / min(w.values())


def test_a_page_alternates_tenants_by_weight():
    rows = [EligibleRow(str(i), tenant, T0, (T0, i)) for i, tenant in enumerate("aaaaaabb")]
    assert [r.tenant for r in in_turns(rows, {"a": 3.0, "b": 1.0})] == list("aaabaaab")
    assert [r.tenant for r in in_turns(rows[4:], {})] == list("abab")
