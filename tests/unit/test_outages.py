"""One transient/permanent classification, the backoff, the registry's negative cache, and the
database connect timeout against a port that never answers."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, ProgrammingError

from lapse.kernel.codec import Codec, DecodeError, SchemaStore
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import PERMANENT_ERRORS, DeliveryFailed
from lapse.kernel.outages import Outage, backoff_s, is_transient
from lapse.kernel.package_files import schemas_dir
from lapse.kernel.schema_registry import SchemaRegistryClient, SchemaRegistryError
from tests.fixtures.faults import schema_registry, silent_listener


def _db_error(cls, invalidated: bool = False):
    return cls("SELECT 1", {}, Exception("driver said no"), connection_invalidated=invalidated)


def test_database_errors_of_an_away_database_are_transient():
    assert is_transient(_db_error(OperationalError))
    assert is_transient(_db_error(InterfaceError))
    assert is_transient(_db_error(ProgrammingError, invalidated=True))  # the pool saw a disconnect
    assert not is_transient(_db_error(ProgrammingError))
    assert not is_transient(_db_error(IntegrityError))


def test_broker_errors_are_transient_unless_fatal_or_permanent():
    assert is_transient(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert is_transient(KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN)))
    assert not is_transient(KafkaException(KafkaError(KafkaError._FENCED, fatal=True)))
    for code in PERMANENT_ERRORS:
        assert not is_transient(KafkaException(KafkaError(code)))
    assert is_transient(DeliveryFailed("3 records still in flight"))
    assert not is_transient(DeliveryFailed("refused for size", permanent=True))


@given(st.one_of(st.none(), st.integers(100, 599)))
def test_registry_errors_are_transient_for_network_5xx_and_429_only(status):
    exc = SchemaRegistryError("schema registry said so", status)
    expected = status is None or status >= 500 or status == 429
    assert is_transient(exc) is expected
    assert is_transient(DecodeError("registry_unavailable", "…", transient=expected)) is expected


def test_bugs_and_bad_input_are_not_transient():
    assert not is_transient(ValueError("a bug"))
    assert not is_transient(DecodeError("unknown_schema_id", "schema id 7 is not in the registry"))
    assert not is_transient(KeyError("op_key"))


@given(failures=st.integers(1, 10_000), draw=st.floats(0, 1, exclude_max=True),
       base=st.floats(0.01, 5), cap=st.floats(5, 120))
def test_backoff_is_capped_and_jittered_within_its_upper_half(failures, draw, base, cap):
    nominal = min(cap, base * 2 ** min(failures - 1, 32))
    wait = backoff_s(failures, base_s=base, cap_s=cap, rng=lambda: draw)
    assert nominal / 2 <= wait <= nominal <= cap


def test_an_outage_logs_one_warning_however_many_tries_fail(caplog):
    outage = Outage("relay", logging.getLogger("lapse.test"), base_s=0.001, cap_s=0.002)
    stop = threading.Event()
    with caplog.at_level(logging.DEBUG, logger="lapse.test"):
        for _ in range(2):  # two outages of 20 failed tries each
            for _ in range(20):
                outage.wait(OperationalError("SELECT 1", {}, Exception("server closed the connection")), stop)
            outage.over()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and all("unavailable" in r.getMessage() for r in warnings)
    assert outage.outages == 2 and outage.failures == 0


def _confluent(schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + b"\x02"


def test_an_unknown_schema_id_is_asked_for_once_then_poison_from_the_cache():
    with schema_registry() as registry:
        client = SchemaRegistryClient(registry.url)
        codec = Codec(SchemaStore(schemas_dir()), client)
        for _ in range(300):
            with pytest.raises(DecodeError) as caught:
                codec.decode(_confluent(4242))
            assert caught.value.reason == "unknown_schema_id" and not caught.value.transient
        assert registry.requests[("GET", "/schemas/ids/4242")] == 1


def test_a_cached_unknown_id_is_asked_again_after_its_time_and_then_found():
    now = [0.0]
    with schema_registry() as registry:
        client = SchemaRegistryClient(registry.url, not_found_ttl_s=60, clock=lambda: now[0])
        with pytest.raises(SchemaRegistryError):
            client.schema_by_id(1)
        registry.schemas[1] = '{"type": "string"}'
        now[0] = 59.0
        with pytest.raises(SchemaRegistryError) as cached:
            client.schema_by_id(1)
        assert cached.value.not_found
        now[0] = 61.0
        assert client.schema_by_id(1) == '{"type": "string"}'
        assert registry.requests[("GET", "/schemas/ids/1")] == 2


def test_a_registry_that_is_down_is_transient_and_not_cached():
    with schema_registry() as registry:
        client = SchemaRegistryClient(registry.url, timeout_s=2)
        codec = Codec(SchemaStore(schemas_dir()), client)
        registry.stop()
        for _ in range(2):
            with pytest.raises(DecodeError) as caught:
                codec.decode(_confluent(1))
            assert caught.value.transient and is_transient(caught.value)
        assert client.requests == 2


def test_a_database_that_never_answers_fails_within_the_connect_timeout():
    with silent_listener() as listener:
        engine = make_engine(f"postgresql+psycopg://lapse:secret@127.0.0.1:{listener.port}/lapse",
                             connect_timeout_s=2)
        started = time.monotonic()
        try:
            with pytest.raises(OperationalError) as caught, engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    assert time.monotonic() - started < 2 + 8  # the timeout, with a generous margin
    assert is_transient(caught.value)
