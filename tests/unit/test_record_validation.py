"""Validation at the edge: every hostile expiry event, random bytes and delay-tier headers are
either a valid event (wake-up) whose every field fits the ledger, or a dead-letter reason naming
the field at fault — never another exception. The oracles here are written independently of the
code under test (Unicode categories, the ledger's column lengths)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lapse.kernel.codec import Codec, DecodeError, SchemaStore
from lapse.kernel.delays import DUE_AT_HEADER, TARGET_HEADER, InvalidWakeUp, read_wake_up
from lapse.kernel.ledger import (
    ATTEMPT_CAP,
    EARLIEST_DUE,
    LATEST_DUE_AHEAD,
    ExpiryEvent,
    InvalidEvent,
    InvalidField,
    InvalidOpKey,
    OriginalBudget,
    clip_original,
    millis,
)
from lapse.kernel.settings import REPO_ROOT
from lapse.processors.decode import decode_event
from tests.fixtures.hostile import (
    DATETIME_MILLIS,
    ENCODABLE,
    KIND,
    base_record,
    decode_kinds,
    header_lists,
    hostile_records,
    storable_text,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
CODEC = Codec(SchemaStore(REPO_ROOT / "schemas"))
KINDS = decode_kinds(max_attempts=6)
EXPIRY = "lapse.expiry"
# The ledger's columns (lapse/kernel/models.py), restated: what the oracle holds the code to.
COLUMNS = {"tenant": 64, "correlation_id": 64, "source": 16, "replay_id": 64}
HEADER = CODEC.encode("expiry_event", base_record(1, NOW))[:10]  # single-object marker + fingerprint
RUN = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_decoded(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the Avro codec hands it over: timestamps as datetimes."""
    out = dict(record)
    for name in ("due_at", "produced_at"):
        out[name] = datetime.fromtimestamp(0, UTC) + timedelta(milliseconds=record[name])
    return out


def fields_at_fault(record: dict[str, Any], now: datetime, max_attempts: int | None = None) -> set[str]:
    """The fields the ledger (or the window, or the attempt caps) cannot take, by the oracle."""
    bad = {name for name, limit in COLUMNS.items()
           if not (name == "replay_id" and record.get(name) is None) and not storable_text(record.get(name), limit)}
    for name in ("due_at", "produced_at"):
        if not millis(EARLIEST_DUE) <= record[name] <= millis(now + LATEST_DUE_AHEAD):
            bad.add(name)
    if not 0 <= record["attempt"] <= (ATTEMPT_CAP if max_attempts is None else min(ATTEMPT_CAP, max_attempts)):
        bad.add("attempt")
    attrs = record["attributes"]
    if len(attrs) > 32 or not all(storable_text(k, 64) and (v == "" or storable_text(v, 1024))
                                  for k, v in attrs.items()):
        bad.add("attributes")
    return bad


def op_key_matches(record: dict[str, Any]) -> bool:
    return record["op_key"] == f"{record['kind']}:{record['subject_id']}"


def assert_fits_the_ledger(event: ExpiryEvent, record: dict[str, Any]) -> None:
    for name, limit in COLUMNS.items():
        value = getattr(event, name)
        assert value == record[name] and (value is None or storable_text(value, limit))
    assert event.op_key == f"{event.kind}:{event.subject_id}" == record["op_key"]
    assert 0 <= event.attempt <= ATTEMPT_CAP
    assert EARLIEST_DUE <= event.due_at <= NOW + LATEST_DUE_AHEAD


@RUN
@given(hostile_records(NOW).filter(lambda r: all(DATETIME_MILLIS[0] <= r[n] <= DATETIME_MILLIS[1]
                                                 for n in ("due_at", "produced_at"))))
@example({**base_record(1, NOW), "tenant": "t\x00"})
@example({**base_record(1, NOW), "attempt": 2**31 - 1})
@example({**base_record(1, NOW), "due_at": millis(datetime(2100, 1, 1, tzinfo=UTC))})
def test_a_hostile_record_is_a_valid_event_or_names_every_field_at_fault(record):
    expected = fields_at_fault(record, NOW)
    malformed_key = not record["op_key"].startswith(f"{KIND}:") or " " in record["op_key"]
    try:
        event = ExpiryEvent.from_record(as_decoded(record), NOW)
    except InvalidOpKey:
        assert malformed_key or (not expected and not op_key_matches(record))
    except InvalidField as exc:
        assert not malformed_key and set(exc.fields) == expected and expected
        assert all(f"{name}:" in str(exc) for name in expected)
    else:
        assert not expected and op_key_matches(record)
        assert_fits_the_ledger(event, record)


@RUN
@given(hostile_records(NOW))
def test_a_hostile_record_on_the_wire_decodes_to_a_valid_event_or_a_reason_naming_its_field(record):
    value = CODEC.encode("expiry_event", record)
    try:
        event = decode_event(value, CODEC, KINDS, NOW)
    except (DecodeError, InvalidEvent) as exc:
        code = exc.reason if isinstance(exc, DecodeError) else exc.code
        if code == "invalid_field":
            named = {name for name in fields_at_fault(record, NOW, max_attempts=6) if f"{name}:" in str(exc)}
            assert named, str(exc)
        else:
            assert code == "malformed_op_key" and not op_key_matches(record)
    else:
        assert not fields_at_fault(record, NOW, max_attempts=6)
        assert_fits_the_ledger(event, {**record, "due_at": None})


@RUN
@given(st.one_of(st.binary(max_size=3000), st.binary(max_size=3000).map(lambda body: HEADER + body)))
def test_random_bytes_are_a_decode_error_or_an_invalid_event_never_another_exception(value):
    try:
        decode_event(value, CODEC, KINDS, NOW)
    except (DecodeError, InvalidEvent) as exc:
        assert str(exc)


def test_more_attempts_than_the_kind_allows_is_invalid_at_decode():
    value = CODEC.encode("expiry_event", {**base_record(1, NOW), "attempt": 7})
    with pytest.raises(InvalidField, match="attempt: 7 is more than the 6 attempts"):
        decode_event(value, CODEC, KINDS, NOW)
    assert decode_event(CODEC.encode("expiry_event", {**base_record(1, NOW), "attempt": 6}),
                        CODEC, KINDS, NOW).attempt == 6


def test_a_timestamp_no_datetime_can_hold_names_its_field():
    value = CODEC.encode("expiry_event", {**base_record(1, NOW), "due_at": 2**63 - 1})
    with pytest.raises(DecodeError, match="due_at: 9223372036854775807") as caught:
        decode_event(value, CODEC, KINDS, NOW)
    assert caught.value.reason == "invalid_field" and not caught.value.transient


# --- Delay-tier headers ------------------------------------------------------------------------

def due_values() -> st.SearchStrategy[bytes | None]:
    """lapse-due-at values: epoch ms at the window's edges and past them, huge, negative, padded,
    non-ASCII digits, garbage, missing."""
    edges = [millis(EARLIEST_DUE) - 1, millis(EARLIEST_DUE), millis(NOW), millis(NOW + LATEST_DUE_AHEAD),
             millis(NOW + LATEST_DUE_AHEAD) + 1, 0, 2**63 - 1, 10**30]
    return st.one_of(
        st.integers(millis(EARLIEST_DUE), millis(NOW + LATEST_DUE_AHEAD)).map(lambda n: str(n).encode()),
        st.sampled_from(edges).map(lambda n: str(n).encode()),
        st.integers(-(10**20), 10**20).map(lambda n: str(n).encode()),
        st.sampled_from([b"", b" 1700000000000", b"1_700_000_000_000", b"+1700000000000", b"1.7e12",
                         "\u0661\u0667".encode() * 6, b"\xff\xfe", b"9" * 40]),
        st.binary(max_size=40), st.none())


def target_values() -> st.SearchStrategy[bytes | None]:
    return st.one_of(st.just(EXPIRY.encode()), st.none(),
                     st.sampled_from([b"lapse.outcomes", b"lapse.dlq", EXPIRY.encode() + b"\x00",
                                      b"\xff" + EXPIRY.encode(), b"x" * 300, b""]),
                     st.text(ENCODABLE, max_size=60).map(str.encode), st.binary(max_size=60))


@st.composite
def wake_up_headers(draw: st.DrawFn) -> list[tuple[str, bytes | None]]:
    headers = draw(header_lists().map(lambda pairs: [p for p in pairs if p[0] not in (DUE_AT_HEADER, TARGET_HEADER)]))
    for name, values in ((DUE_AT_HEADER, due_values()), (TARGET_HEADER, target_values())):
        for _ in range(draw(st.sampled_from([1, 1, 1, 0, 2]))):
            headers.insert(draw(st.integers(0, len(headers))), (name, draw(values)))
    return headers


def due_ok(raw: bytes) -> bool:
    if not raw.isdigit() or not raw.isascii() or len(raw) > 14:
        return False
    return millis(EARLIEST_DUE) <= int(raw) <= millis(NOW + LATEST_DUE_AHEAD)


@RUN
@given(wake_up_headers())
@example([(DUE_AT_HEADER, b"1764504000000"), (TARGET_HEADER, b"\xff\xfe")])
@example([(DUE_AT_HEADER, b"1764504000000"), (TARGET_HEADER, b"elsewhere")])
@example([(DUE_AT_HEADER, b"99999999999999999999999"), (TARGET_HEADER, EXPIRY.encode())])
def test_delay_headers_are_a_wake_up_for_the_expiry_topic_or_a_reason_naming_the_header(headers):
    dues = [v for k, v in headers if k == DUE_AT_HEADER]
    targets = [v for k, v in headers if k == TARGET_HEADER]
    try:
        wake = read_wake_up(headers, EXPIRY, NOW)
    except InvalidWakeUp as exc:
        assert str(exc).startswith((DUE_AT_HEADER, TARGET_HEADER))
        assert exc.code in ("missing_header", "invalid_header", "duplicate_header", "refused_target")
    else:
        assert wake.target == EXPIRY  # a tier forwards nowhere else
        assert len(set(dues)) == 1 and dues[0] and due_ok(dues[0])
        assert wake.due_at == datetime.fromtimestamp(0, UTC) + timedelta(milliseconds=int(dues[0]))
        assert len(set(targets)) <= 1 and (not targets or targets[0] in (EXPIRY.encode(), b"", None))


# --- The original bytes a dead letter keeps ----------------------------------------------------

@RUN
@given(key=st.none() | st.binary(max_size=400), value=st.none() | st.binary(max_size=5000),
       headers=header_lists(), budget=st.builds(OriginalBudget, st.integers(0, 300), st.integers(0, 4000),
                                               st.integers(0, 500)))
def test_a_clipped_original_fits_its_budget_and_keeps_the_length_and_hash_of_what_it_was(key, value, headers, budget):
    clipped = clip_original(key, value, headers, budget)
    kept = clipped.original
    assert (kept.key is None) == (key is None) and (kept.value is None) == (value is None)
    for part, original, length, digest in (("key", key, clipped.key_length, clipped.key_sha256),
                                           ("value", value, clipped.value_length, clipped.value_sha256)):
        if original is None:
            assert length is None and digest is None
        else:
            assert length == len(original) and digest == hashlib.sha256(original).hexdigest()
            assert (part in clipped.clipped) == (len(original) > getattr(budget, part))
    assert kept.key is None or (len(kept.key) <= budget.key and key.startswith(kept.key))
    assert kept.value is None or (len(kept.value) <= budget.value and value.startswith(kept.value))
    assert sum(len(k.encode()) + len(v) for k, v in kept.headers.items()) <= budget.headers
    CODEC.encode("dead_letter", {"failure_class": "poison", "reason": "r", "attempt": 0, "source_topic": "t",
                                 "source_partition": 0, "source_offset": 0, "original_key": kept.key,
                                 "original_value": kept.value, "original_headers": dict(kept.headers),
                                 "dead_lettered_at": 0})


def test_a_record_at_the_brokers_limit_keeps_a_quarter_of_the_producers():
    budget = OriginalBudget.under(1_000_000)
    clipped = clip_original(b"k", bytes(1_048_000), [("h", b"v" * 100_000)], budget)
    assert len(clipped.original.value or b"") == 250_000 and clipped.value_length == 1_048_000
    assert clipped.clipped == ("value", "headers")
