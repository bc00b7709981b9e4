"""The soak's verdict: a backlog that keeps building is a trend, the sawtooth of batches is not;
table sizes may not grow over the last half; throughput is compared minute by minute."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from lapse.devtools.soak.load import MIX, sorts_of
from lapse.devtools.soak.samples import Sample
from lapse.devtools.soak.verdict import judge, per_minute, slope

RATE = 100.0


def sample(t: float, lag: int = 0, outbox: int = 0, mb: float = 100.0, finished: int = 0) -> Sample:
    return Sample(at="", elapsed_s=t, lag_records=lag, lag_s=0.0, delay_lag_records=0, outbox_unsent=outbox,
                  outbox_oldest_s=None, oldest_eligible_s=None, table_mb={"lapse_ledger": mb}, finished=finished,
                  finished_per_min=0.0)


def steady(minutes: int = 10, every_s: float = 60.0, **over) -> list[Sample]:
    n = int(minutes * 60 / every_s)
    return [sample(i * every_s, finished=0 if i == 0 else int(RATE * every_s), **over) for i in range(n + 1)]


@given(st.floats(-1e6, 1e6), st.floats(-1e3, 1e3))
def test_slope_of_a_line_is_its_slope(intercept, k):
    xs = [0.0, 10.0, 20.0, 30.0]
    assert abs(slope(xs, [intercept + k * x for x in xs]) - k) <= 1e-6 * max(1.0, abs(k), abs(intercept) / 30)


@given(st.lists(st.integers(0, 900), min_size=4, max_size=40))
def test_a_sawtooth_below_ten_seconds_of_load_is_never_a_trend(lags):
    samples = [sample(i * 15.0, lag=lag) for i, lag in enumerate(lags)]
    assert judge(samples, RATE)["lag_bounded"].ok


def test_a_backlog_that_keeps_building_is_a_trend():
    samples = [sample(i * 60.0, lag=i * 2000) for i in range(11)]
    check = judge(samples, RATE)["lag_bounded"]
    assert not check.ok and "gained 10000" in check.detail


def test_the_outbox_is_judged_like_the_lag():
    samples = [sample(i * 60.0, outbox=i * 5000) for i in range(11)]
    assert not judge(samples, RATE)["outbox_bounded"].ok
    assert judge(steady(outbox=300), RATE)["outbox_bounded"].ok


def test_tables_may_not_grow_over_the_last_half():
    growing = [sample(i * 60.0, mb=100 + 10 * i) for i in range(11)]
    assert not judge(growing, RATE)["sizes_bounded"].ok
    assert judge(steady(mb=250.0), RATE)["sizes_bounded"].ok


def test_throughput_is_compared_whole_minute_by_whole_minute():
    samples = steady(minutes=3, every_s=20.0)
    assert per_minute(samples) == [RATE * 60] * 3
    slowing = samples[:-3] + [sample(t, finished=int(RATE * 20 * 0.5)) for t in (140.0, 160.0, 180.0)]
    check = judge(slowing, RATE)["throughput_held"]
    assert not check.ok and "3000/min" in check.detail


def test_too_few_samples_fail_every_check():
    assert not any(check.ok for check in judge([sample(0.0), sample(60.0)], RATE).values())


@given(st.integers(0, 10_000), st.integers(1, 5000))
def test_the_mix_holds_over_any_stretch(start, count):
    sorts = sorts_of(count, start)
    assert sum(sorts.values()) == count
    for sort, per_200 in MIX.items():
        assert abs(sorts.get(sort, 0) - count * per_200 / 200) <= per_200


def test_tables_rotated_by_partitions_are_reported_and_not_judged():
    """Transitions and the outbox drop whole days and weeks, after any soak: their growth is shown,
    the ledger's alone (which pruning bounds within the run) decides."""
    def with_tables(samples: list[Sample], grows: str) -> list[Sample]:
        return [replace(s, rotated=("lapse_transitions", "lapse_outbox"),
                        table_mb={"lapse_ledger": 100.0 + (i * 10 if grows == "lapse_ledger" else 0),
                                  "lapse_transitions": 300.0 + i * 10, "lapse_outbox": 20.0 + i * 5})
                for i, s in enumerate(samples)]
    rotated = judge(with_tables(steady(), "lapse_transitions"), RATE)["sizes_bounded"]
    assert rotated.ok and "rotated by partitions, not judged: lapse_transitions 350.0 to 400.0 MB" in rotated.detail
    assert not judge(with_tables(steady(), "lapse_ledger"), RATE)["sizes_bounded"].ok
