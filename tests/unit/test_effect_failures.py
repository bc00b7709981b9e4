"""Failure classes of external effects: status codes, Retry-After, transport errors, object keys, URLs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)
from hypothesis import given
from hypothesis import strategies as st

from lapse.kernel.kinds.effects import EffectCall
from lapse.kernel.text import one_line
from lapse.processors.effects.http import render_url, transport_failure
from lapse.processors.effects.object_stores import MAX_KEY_BYTES, FilesystemObjectStore, object_key
from lapse.processors.effects.s3_store import s3_failure
from lapse.processors.effects.s3_store import transport_failure as s3_transport_failure
from lapse.processors.failures import (
    AMBIGUOUS,
    INVALID,
    MAX_RETRY_AFTER_S,
    RATE_LIMITED,
    TEMPORARY,
    EffectFailure,
    classify,
    for_status,
    retry_after_wait,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SENT = format_datetime(NOW, usegmt=True)  # an answer's own Date header


@pytest.mark.parametrize(("status", "expected"), [
    (200, None), (201, None), (204, None), (299, None),
    (429, RATE_LIMITED), (503, RATE_LIMITED),  # a 503 with a Retry-After (given here) too
    (408, TEMPORARY), (500, TEMPORARY), (502, TEMPORARY), (504, TEMPORARY), (599, TEMPORARY),
    (301, INVALID), (400, INVALID), (401, INVALID), (403, INVALID), (404, INVALID), (409, INVALID),
    (422, INVALID),
])
def test_status_codes_map_to_failure_classes(status, expected):
    failure = for_status(status, f"HTTP {status}", retry_after=3.0)
    assert (failure and failure.failure_class) == expected
    if expected == RATE_LIMITED:
        assert failure.retry_after == 3.0
    elif failure is not None:
        assert failure.retry_after is None


def test_a_429_without_retry_after_backs_off_as_usual():
    assert for_status(429, "HTTP 429").retry_after is None


def test_what_an_answer_asks_of_the_whole_route():
    """A 429 slows the route down and its Retry-After stops it; a 503's Retry-After stops it
    without slowing it; a 503 without one is an ordinary temporary failure of this operation."""
    answers = {"429+RA": for_status(429, "x", 3.0), "429": for_status(429, "x"), "503+RA": for_status(503, "x", 3.0),
               "503": for_status(503, "x")}
    assert {name: (f.failure_class, f.slow_down, f.stop_route) for name, f in answers.items()} == {
        "429+RA": (RATE_LIMITED, True, True), "429": (RATE_LIMITED, True, False),
        "503+RA": (RATE_LIMITED, False, True), "503": (TEMPORARY, False, False)}


@given(st.integers(min_value=0, max_value=10**40))
def test_retry_after_seconds_are_honoured_up_to_the_bound(seconds):
    assert retry_after_wait(str(seconds)) == min(seconds, MAX_RETRY_AFTER_S)
    assert retry_after_wait(f"  {seconds}\t", SENT) == min(seconds, MAX_RETRY_AFTER_S)


@given(st.integers(min_value=-10 * 86_400, max_value=10 * 86_400))
def test_retry_after_http_dates_are_measured_from_the_answers_own_date_clamped(offset):
    value = format_datetime(NOW + timedelta(seconds=offset), usegmt=True)
    assert retry_after_wait(value, SENT) == min(max(offset, 0), MAX_RETRY_AFTER_S)


@given(st.integers(min_value=-10 * 86_400, max_value=10 * 86_400), st.sampled_from([None, "", "yesterday"]))
def test_an_http_date_without_a_readable_date_waits_for_the_databases_clock(offset, date):
    """No `Date` to measure from: the time itself, which `wait_s` measures from the database's now."""
    when = NOW + timedelta(seconds=offset)
    asked = retry_after_wait(format_datetime(when, usegmt=True), date)
    assert asked == when
    failure = for_status(429, "HTTP 429", asked)
    assert failure.wait_s(NOW) == min(max(offset, 0), MAX_RETRY_AFTER_S)
    assert failure.wait_s(NOW - timedelta(seconds=300)) == min(max(offset + 300, 0), MAX_RETRY_AFTER_S)


@given(st.text(max_size=60), st.one_of(st.none(), st.text(max_size=40), st.just(SENT)))
def test_any_retry_after_text_is_none_or_a_bounded_wait(value, date):
    asked = retry_after_wait(value, date)
    wait = EffectFailure(RATE_LIMITED, "429", asked).wait_s(NOW)
    assert wait is None or 0 <= wait <= MAX_RETRY_AFTER_S


@pytest.mark.parametrize("value", [None, "", "soon", "-5", "-0", "1.5", "1e3", "٣", "²",
                                   "Mon, 99 Foo 2026 99:99:99 GMT", "9" * 5000])
def test_garbage_negative_and_odd_retry_after_values(value):
    wait = retry_after_wait(value, SENT)
    if value == "9" * 5000:
        assert wait == MAX_RETRY_AFTER_S  # more digits than any sane wait: the bound, no int() blow-up
    else:
        assert wait is None


def test_a_retry_after_time_without_a_zone_is_refused():
    with pytest.raises(ValueError, match="timezone-aware"):
        EffectFailure(RATE_LIMITED, "429", datetime(2026, 11, 30, 12, 0))


def test_an_http_date_without_zone_is_utc_and_the_far_future_is_bounded():
    assert retry_after_wait("Mon, 30 Nov 2026 12:00:10 -0000", SENT) == 10
    assert retry_after_wait("Fri, 31 Dec 9999 23:59:59 GMT", SENT) == MAX_RETRY_AFTER_S
    assert EffectFailure(RATE_LIMITED, "429", retry_after_wait("Fri, 31 Dec 9999 23:59:59 GMT")).wait_s(
        NOW) == MAX_RETRY_AFTER_S


@given(st.text(max_size=500))
def test_excerpts_are_one_short_line(text):
    line = one_line(text, 120)
    assert len(line) <= 120 and "\n" not in line and "\r" not in line


def test_unknown_exceptions_are_classified_conservatively():
    assert classify(TimeoutError("t")).failure_class == AMBIGUOUS
    assert classify(ConnectionRefusedError("c")).failure_class == TEMPORARY
    assert classify(ValueError("v")).failure_class == INVALID
    assert classify(RuntimeError("r")).failure_class == AMBIGUOUS


@pytest.mark.parametrize(("exc", "expected"), [
    (httpx.ConnectError("refused"), TEMPORARY),
    (httpx.ConnectTimeout("connect timed out"), TEMPORARY),
    (httpx.PoolTimeout("pool"), TEMPORARY),
    (httpx.ReadTimeout("timed out"), AMBIGUOUS),
    (httpx.WriteTimeout("timed out"), AMBIGUOUS),
    (httpx.RemoteProtocolError("Server disconnected without sending a response."), AMBIGUOUS),
    (httpx.ReadError("reset"), AMBIGUOUS),
    (httpx.UnsupportedProtocol("Request URL has an unsupported protocol 'ftp://'."), INVALID),
    (httpx.LocalProtocolError("Illegal header value b'Bearer s3cr3t\\n'"), INVALID),
])
def test_http_transport_errors_split_on_whether_the_request_was_sent(exc, expected):
    failure = transport_failure(exc, "POST", "api.example:443")
    assert failure.failure_class == expected
    assert "s3cr3t" not in failure.reason  # a header error's message is never repeated


def _client_error(code: str, status: int, headers: dict[str, str] | None = None) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} message"},
                        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}}},
                       "DeleteObject")


@pytest.mark.parametrize(("code", "status", "expected"), [
    ("NoSuchKey", 404, None), ("NotFound", 404, None),
    ("SlowDown", 503, RATE_LIMITED), ("TooManyRequests", 429, RATE_LIMITED),
    ("ServiceUnavailable", 503, TEMPORARY), ("InternalError", 500, TEMPORARY),
    ("RequestTimeout", 400, TEMPORARY),
    ("AccessDenied", 403, INVALID), ("InvalidRequest", 400, INVALID), ("NoSuchBucket", 404, INVALID),
    ("KeyTooLongError", 400, INVALID), ("SomethingNew", 400, INVALID), ("SomethingNew", 502, TEMPORARY),
])
def test_s3_error_codes_map_to_failure_classes(code, status, expected):
    failure = s3_failure(_client_error(code, status), "exports/a.csv")
    assert (failure and failure.failure_class) == expected


def test_s3_slow_down_carries_its_retry_after():
    assert s3_failure(_client_error("SlowDown", 503, {"retry-after": "12"}), "k").retry_after == 12
    assert s3_failure(_client_error("SlowDown", 503), "k").retry_after is None
    later = format_datetime(NOW + timedelta(seconds=40), usegmt=True)
    assert s3_failure(_client_error("SlowDown", 503, {"retry-after": later, "date": SENT}), "k").retry_after == 40
    assert s3_failure(_client_error("SlowDown", 503, {"retry-after": later}), "k").wait_s(NOW) == 40


@pytest.mark.parametrize(("exc", "expected"), [
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), TEMPORARY),
    (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), TEMPORARY),
    (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), AMBIGUOUS),
    (NoCredentialsError(), INVALID),
])
def test_s3_transport_errors(exc, expected):
    assert s3_transport_failure(exc).failure_class == expected


@pytest.mark.parametrize("value", [None, "", 7, "a\0b", "k" * (MAX_KEY_BYTES + 1), "é" * 513])
def test_object_keys_are_checked_before_any_call(value):
    with pytest.raises(EffectFailure) as info:
        object_key("", value)
    assert info.value.failure_class == INVALID


def test_object_keys_count_the_prefix():
    assert object_key("exports/", "a.csv") == "exports/a.csv"
    assert object_key("", "k" * MAX_KEY_BYTES) == "k" * MAX_KEY_BYTES
    with pytest.raises(EffectFailure):
        object_key("p/", "k" * (MAX_KEY_BYTES - 1))


def test_filesystem_store_refuses_paths_outside_its_folder_and_deletes_if_present(tmp_path):
    store = FilesystemObjectStore(tmp_path)
    for key in ("../x", "/etc/passwd", "a/../../x"):
        with pytest.raises(EffectFailure):
            store.delete(key)
    store.put("a/b.csv")
    assert store.delete("a/b.csv") is True and store.delete("a/b.csv") is False and store.removed == 1


def test_filesystem_store_never_follows_a_symbolic_link_out_of_its_folder(tmp_path):
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    for victim in ("victim.csv", "deep/victim.csv"):
        (outside / victim).write_text("keep me")
    store = FilesystemObjectStore(tmp_path / "objects")
    store.put("a/real.csv")
    (store.root / "up").symlink_to(outside)
    (store.root / "a" / "abs").symlink_to(outside.resolve())
    (store.root / "file-link.csv").symlink_to(outside / "victim.csv")

    for key in ("up/victim.csv", "up/deep/victim.csv", "a/abs/victim.csv"):
        with pytest.raises(EffectFailure) as info:
            store.delete(key)
        assert info.value.failure_class == INVALID and "symbolic link" in info.value.reason, key
        assert store.exists(key) is False
    assert store.delete("file-link.csv") is True  # the link is the object: it goes, what it names stays
    assert store.delete("a/real.csv/x") is False and store.delete("nowhere/x") is False
    assert store.delete("a/real.csv") is True
    assert sorted(str(p.relative_to(outside)) for p in outside.rglob("*.csv")) == ["deep/victim.csv", "victim.csv"]
    assert sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*")) == ["a", "a/abs", "up"]


def _call(target: dict) -> EffectCall:
    return EffectCall("notify", "notify:7", 2, "7", "t 1", target)


def test_url_templates_fill_and_encode_every_placeholder():
    url = render_url("https://api.example/v1/{region}/hooks/{subject_id}?t={tenant}&k={op_key}&x={{y}}",
                     _call({"region": "eu/west", "due_at": NOW}))
    assert url == "https://api.example/v1/eu%2Fwest/hooks/7?t=t%201&k=notify%3A7&x={y}"
    assert render_url("https://a/{due_at}", _call({"due_at": NOW})) == "https://a/2026-11-30T12%3A00%3A00%2B00%3A00"


@pytest.mark.parametrize("template", ["https://a/{missing}", "https://a/{nothing}", "https://a/{"])
def test_a_placeholder_without_a_value_makes_the_call_invalid(template):
    with pytest.raises(EffectFailure) as info:
        render_url(template, _call({"nothing": None}))
    assert info.value.failure_class == INVALID


def test_a_failure_reason_is_one_bounded_line_without_control_characters():
    failure = classify(RuntimeError("line one\nline\x00two " + "x" * 1000))
    assert "\n" not in failure.reason and "\x00" not in failure.reason and len(failure.reason) <= 500
    assert EffectFailure(TEMPORARY, "503\r\nService\tUnavailable").reason == "503 Service Unavailable"
