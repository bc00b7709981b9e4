"""The trace context: a `traceparent` from outside is kept when well-formed and dropped otherwise,
never failing its record; the stage spans cost nothing while tracing is off, and follow the senders'
sampling decisions while it is on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Message
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace import StatusCode
from pydantic import ValidationError

from lapse.kernel import tracing
from lapse.kernel.codec import Codec
from lapse.kernel.ledger import expiry_event, expiry_record
from lapse.kernel.schema_names import EXPIRY_EVENT
from lapse.kernel.settings import TracingSettings, load_settings
from lapse.kernel.trace_context import TRACEPARENT, is_sampled, trace_id_of, traceparent_in, traceparent_of
from lapse.processors.decode import decode_batch
from lapse.shell import tracing_setup
from lapse.shell.startup_checks import StartupRefused
from tests.fixtures.spans import trace_of

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def hex_of(length: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdef", min_size=length, max_size=length)


@given(trace_id=hex_of(32), parent_id=hex_of(16), flags=hex_of(2))
def test_a_well_formed_version_00_is_kept_as_it_is(trace_id, parent_id, flags):
    value = f"00-{trace_id}-{parent_id}-{flags}"
    expected = None if set(trace_id) == {"0"} or set(parent_id) == {"0"} else value
    assert traceparent_of(value) == expected
    assert traceparent_of(value.encode()) == expected


@given(version=hex_of(2).filter(lambda v: v not in ("00", "ff")), trace_id=hex_of(32).filter(lambda t: "1" in t),
       parent_id=hex_of(16).filter(lambda p: "1" in p), flags=hex_of(2), more=st.text("-abc0", max_size=20))
def test_a_later_version_is_read_as_far_as_version_00_goes(version, trace_id, parent_id, flags, more):
    value = f"{version}-{trace_id}-{parent_id}-{flags}" + (f"-{more}" if more else "")
    assert traceparent_of(value) == f"00-{trace_id}-{parent_id}-{flags}"


@pytest.mark.parametrize("value", [
    None, "", 42, VALID.upper(), VALID + "-", VALID + "x", " " + VALID, VALID[:-1], VALID.replace("-", "_"),
    "ff" + VALID[2:], "00-" + "0" * 32 + VALID[35:], VALID[:36] + "0" * 16 + VALID[52:],
    "01" + VALID[2:] + "x", VALID.encode("utf-16"), ("00-" + "a" * 300).encode(), "00-ünïcode" + VALID[10:],
])
def test_a_malformed_traceparent_is_dropped(value):
    assert traceparent_of(value) is None


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
def test_any_value_is_either_dropped_or_a_version_00_traceparent(value):
    kept = traceparent_of(value)
    assert kept is None or (len(kept) == 55 and traceparent_of(kept) == kept)


def test_one_traceparent_header_is_read_and_several_are_dropped():
    assert traceparent_in([("a", b"1"), (TRACEPARENT, VALID.encode())]) == VALID
    assert traceparent_in({TRACEPARENT: VALID}) == VALID
    assert traceparent_in([(TRACEPARENT, VALID.encode()), (TRACEPARENT, VALID.encode())]) is None
    assert traceparent_in(None) is None and traceparent_in([(TRACEPARENT, None)]) is None
    assert is_sampled(VALID) and not is_sampled(VALID[:-2] + "00")
    assert trace_id_of(VALID) == "4bf92f3577b34da6a3ce929d0e0e4736"


def _record(codec: Codec, rid: int, headers) -> Message:
    event = expiry_event("release-reservation", rid, "t1", datetime.now(UTC) - timedelta(minutes=1), source="sweep")
    value = codec.encode(EXPIRY_EVENT, expiry_record(event, datetime.now(UTC)))
    return Message(topic="lapse.expiry", partition=0, offset=rid, key=event.op_key.encode(), value=value,
                   headers=headers)


@given(headers=st.lists(st.tuples(st.sampled_from([TRACEPARENT, "other"]),
                                  st.one_of(st.none(), st.binary(max_size=80))), max_size=4))
def test_no_header_makes_a_record_poison_and_only_a_valid_one_travels(headers):
    codec = Codec.from_settings(load_settings())
    events, _, poison = decode_batch([_record(codec, 1, headers)], codec, {})
    assert poison == [] and len(events) == 1
    assert events[0].traceparent == traceparent_in(headers)


def test_a_valid_header_travels_with_the_decoded_event():
    codec = Codec.from_settings(load_settings())
    events, _, _ = decode_batch([_record(codec, 1, [(TRACEPARENT, VALID.encode())]),
                                 _record(codec, 2, [(TRACEPARENT, b"00-not-a-trace-context")])], codec, {})
    assert [e.traceparent for e in events] == [VALID, None]


def test_stages_read_nothing_and_carry_the_parent_while_tracing_is_off():
    class Untouchable:
        def __iter__(self):
            raise AssertionError("the records were read with tracing off")

    assert not tracing.enabled()
    with tracing.stage(tracing.PROCESS, Untouchable()):
        pass
    with tracing.span(tracing.EFFECT, VALID) as carried:
        assert carried == VALID


def test_a_stage_has_one_span_per_sampled_trace_and_one_for_the_untraced(recorded_spans):
    unsampled = VALID[:3] + "1" * 32 + VALID[35:-2] + "00"
    other = VALID[:3] + "2" * 32 + VALID[35:]
    traced = [(VALID, "k1"), (VALID, "k2"), (other, "k3"), (unsampled, "k4"), (None, "k5"), (None, "k6")]
    with pytest.raises(RuntimeError), tracing.stage(tracing.PROCESS, iter(traced), {"lapse.batch.events": 6}):
        raise RuntimeError("the batch failed")
    spans = {(trace_of(s), tuple(s.attributes["lapse.op_keys"])): s for s in recorded_spans.get_finished_spans()}
    assert len(spans) == 3
    assert set(spans) >= {(trace_id_of(VALID), ("k1", "k2")), (trace_id_of(other), ("k3",))}
    untraced = next(s for (t, keys), s in spans.items() if keys == ("k5", "k6"))
    assert untraced.parent is None and spans[(trace_id_of(VALID), ("k1", "k2"))].parent.span_id == int(VALID[36:52], 16)
    assert all(s.status.status_code is StatusCode.ERROR for s in spans.values())
    with tracing.span(tracing.EFFECT, VALID) as carried:
        assert carried is not None and carried != VALID and trace_id_of(carried) == trace_id_of(VALID)


def test_tracing_is_off_by_default_and_takes_only_an_http_endpoint():
    assert load_settings().tracing == TracingSettings(endpoint=None, service_name="lapse", sample_ratio=1.0)
    assert TracingSettings(endpoint="https://collector:4318/v1/traces").endpoint
    for endpoint in ("collector:4318", "ftp://collector/v1/traces", "http://:4318/", "http://collector:x/"):
        with pytest.raises(ValidationError):
            TracingSettings(endpoint=endpoint)
    with pytest.raises(ValidationError):
        TracingSettings(sample_ratio=1.5)


def test_a_role_sends_spans_when_an_endpoint_is_set_and_refuses_without_the_extra(monkeypatch):
    settings = load_settings(tracing={"endpoint": "http://127.0.0.1:9/v1/traces", "service_name": "lapse-test"})
    tracing_setup.start_tracing(load_settings())
    assert not tracing.enabled()
    try:
        tracing_setup.start_tracing(settings)
        assert tracing.enabled()
    finally:
        tracing.use(None)
    monkeypatch.setattr(tracing_setup, "OTEL_MODULES", ("opentelemetry.not_installed",))
    with pytest.raises(StartupRefused, match=r"LAPSE_TRACING__ENDPOINT is set but .* pip install 'lapse\[otel\]'"):
        tracing_setup.start_tracing(settings)
