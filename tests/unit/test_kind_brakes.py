"""What a kind declares about its brakes (lapse/kernel/kinds/brakes.py): a mode of live or shadow,
a budget of 1 to 10,000,000 effects over 1 s to 7 days or `false`, and the default budget of a
destructive effect; anything else is one line naming the kind and the field, before a database is
seen."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.brakes import Budget
from lapse.kernel.kinds.brakes import DEFAULT_DESTRUCTIVE, effective_budget, window_seconds
from lapse.kernel.kinds.declarations import DeclaredKind, parse_kind
from lapse.kernel.kinds.errors import KindError

BASE = {"table": "t", "id": "id", "due": "d", "effect": {"delete": {}}}


def declared(**extra) -> DeclaredKind:
    decl = parse_kind("k", {**BASE, **extra})
    assert isinstance(decl, DeclaredKind)
    return decl


@pytest.mark.parametrize(("budget", "message"), [
    ({"max_effects": 0, "per": "1h"}, "budget.max_effects: Input should be greater than or equal to 1"),
    ({"max_effects": -5, "per": "1h"}, "budget.max_effects: Input should be greater than or equal to 1"),
    ({"max_effects": 10**9, "per": "1h"}, "budget.max_effects: Input should be less than or equal to 10000000"),
    ({"max_effects": "100", "per": "1h"}, "budget.max_effects: Input should be a valid integer"),
    ({"max_effects": 1.5, "per": "1h"}, "budget.max_effects: Input should be a valid integer"),
    ({"max_effects": 10, "per": "8d"}, "budget: a budget's window is a duration like 30m, 1h or 1d, at most 7d"),
    ({"max_effects": 10, "per": "0m"}, "budget: a budget's window is a duration like 30m, 1h or 1d, at most 7d"),
    ({"max_effects": 10, "per": "-1h"}, "budget: a budget's window is a duration like 30m, 1h or 1d, at most 7d"),
    ({"max_effects": 10, "per": 3600}, "budget.per: Input should be a valid string"),
    ({"max_effects": 10}, "budget.per: Field required"),
    ({"max_effects": 10, "per": "1h", "burst": 2}, "budget.burst: Extra inputs are not permitted"),
    ("10000/h", "budget: expected {max_effects: N, per: 1h} or false (no budget)"),
    (True, "budget: expected {max_effects: N, per: 1h} or false (no budget)"),
    (0, "budget: expected {max_effects: N, per: 1h} or false (no budget)"),
])
def test_a_wrong_budget_is_one_line_naming_the_field(budget, message):
    with pytest.raises(KindError) as refused:
        declared(budget=budget)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("mode", ["dry-run", "LIVE", "", None, 1])
def test_a_mode_other_than_live_or_shadow_is_refused(mode):
    with pytest.raises(KindError, match=r"^mode: Input should be 'live' or 'shadow'"):
        declared(mode=mode)


def test_a_destructive_effect_gets_the_default_budget_unless_it_says_otherwise():
    default = DEFAULT_DESTRUCTIVE.budget()
    assert (default.max_effects, default.per_s, default.per_tenant) == (10_000, 3600.0, False)
    assert effective_budget(declared().budget, destructive=True) == default
    assert effective_budget(declared(budget=False).budget, destructive=True) is None
    assert effective_budget(None, destructive=False) is None
    own = declared(budget={"max_effects": 7, "per": "30m", "per_tenant": True}).budget
    assert effective_budget(own, destructive=True) == Budget(7, 1800.0, True)
    assert Budget(7, 1800.0, True).text() == "7 per 30m per tenant"


@given(amount=st.integers(min_value=-10, max_value=10_000_100),
       unit=st.sampled_from(["s", "m", "h", "d", "w", "ms", ""]))
def test_a_budget_window_is_accepted_exactly_when_it_is_1s_to_7d(amount, unit):
    text = f"{amount}{unit}"
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86_400}.get(unit)
    valid = seconds is not None and 1 <= amount <= 9_999_999 and 1 <= amount * seconds <= 7 * 86_400
    try:
        got = window_seconds(text)
    except ValueError:
        assert not valid
    else:
        assert valid and got == amount * seconds


@given(n=st.integers(min_value=-(2**63), max_value=2**63))
def test_a_budget_size_is_accepted_exactly_from_1_to_ten_million(n):
    try:
        decl = declared(budget={"max_effects": n, "per": "1h"})
    except KindError:
        assert not 1 <= n <= 10_000_000
    else:
        assert 1 <= n <= 10_000_000 and decl.budget is not False and decl.budget is not None
        assert decl.budget.budget().max_effects == n
