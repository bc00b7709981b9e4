"""One transient/permanent classification, the backoff, the registry's negative cache, and the
database connect timeout against a port that never answers."""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.exc import InternalError as SAInternalError

from lapse.kernel.codec import Codec, DecodeError, SchemaStore
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import PERMANENT_ERRORS, DeliveryFailed
from lapse.kernel.outages import (
    OUTAGE_SQLSTATES,
    Outage,
    backoff_s,
    database_outage,
    is_conflict,
    is_transient,
    sqlstate,
)
from lapse.kernel.package_files import schemas_dir
from lapse.kernel.schema_registry import SchemaRegistryClient, SchemaRegistryError
from lapse.kernel.settings import load_settings
from lapse.processors.commit import values_at_fault
from lapse.shell.error_boundary import ExitCode, diagnose
from tests.fixtures.faults import schema_registry, silent_listener


def _db_error(cls, invalidated: bool = False):
    return cls("SELECT 1", {}, Exception("driver said no"), connection_invalidated=invalidated)


def test_database_errors_of_an_away_database_are_transient():
    assert is_transient(_db_error(OperationalError))
    assert is_transient(_db_error(InterfaceError))
    assert is_transient(_db_error(ProgrammingError, invalidated=True))  # the pool saw a disconnect
    assert not is_transient(_db_error(ProgrammingError))
    assert not is_transient(_db_error(IntegrityError))


def _wrapped(orig: psycopg.Error) -> DBAPIError:
    """A psycopg error as SQLAlchemy raises it (the wrapper class follows the DB-API class)."""
    return DBAPIError.instance("INSERT INTO lapse_ledger VALUES (…)", {}, orig, psycopg.Error)


# What a failover says, by SQLSTATE: psycopg's class for each code, raised as SQLAlchemy wraps it.
FAILOVER = {
    "25006": "cannot execute INSERT in a read-only transaction",
    "57P01": "terminating connection due to administrator command",
    "57P02": "terminating connection because of crash of another server process",
    "57P03": "the database system is starting up",
    "08000": "connection exception",
    "08003": "connection does not exist",
    "08006": "connection failure",
    "08001": "could not connect to server",
    "08004": "server rejected the connection",
    "40001": "could not serialize access due to concurrent update",
    "40P01": "deadlock detected",
    "57014": "canceling statement due to statement timeout",
}


@pytest.mark.parametrize("code", sorted(FAILOVER))
def test_each_failover_sqlstate_is_an_outage_whatever_its_db_api_class(code):
    orig = psycopg.errors.lookup(code)(FAILOVER[code])
    assert orig.sqlstate == code
    for exc in (orig, _wrapped(orig)):
        assert sqlstate(exc) == code
        assert database_outage(exc) is not None, (code, type(exc))
        assert is_transient(exc), (code, type(exc))
    assert not values_at_fault(_wrapped(orig))  # never one event's fault: never dead-lettered for it


def test_read_only_is_an_outage_though_psycopg_calls_it_an_internal_error():
    orig = psycopg.errors.ReadOnlySqlTransaction("cannot execute CREATE TABLE in a read-only transaction")
    wrapped = _wrapped(orig)
    assert isinstance(wrapped, SAInternalError) and not isinstance(wrapped, OperationalError)
    assert database_outage(wrapped) == "read-only"
    assert OUTAGE_SQLSTATES["25006"] == "read-only"


def test_a_connection_closed_mid_transaction_without_a_sqlstate_is_an_outage():
    for orig in (psycopg.OperationalError("server closed the connection unexpectedly"),
                 psycopg.OperationalError("consuming input failed: SSL SYSCALL error: EOF detected"),
                 psycopg.InterfaceError("the connection is closed")):
        assert sqlstate(orig) is None
        assert database_outage(_wrapped(orig)) == "connection lost"
        assert is_transient(orig) and is_transient(_wrapped(orig))


def test_only_deadlocks_and_serialization_failures_are_conflicts():
    assert is_conflict(_wrapped(psycopg.errors.DeadlockDetected("deadlock detected")))
    assert is_conflict(_wrapped(psycopg.errors.SerializationFailure("could not serialize")))
    assert not is_conflict(_wrapped(psycopg.errors.ReadOnlySqlTransaction("read-only")))
    assert not is_conflict(_wrapped(psycopg.OperationalError("server closed the connection")))


@pytest.mark.parametrize("code", ["42601", "42P01", "42703", "42501", "22P02", "23505", "23502", "XX000",
                                  "25P02", "0A000", "P0001"])
def test_what_no_retry_cures_is_not_an_outage(code):
    exc = _wrapped(psycopg.errors.lookup(code)("refused"))
    assert database_outage(exc) is None and not is_transient(exc), code


def test_a_value_refused_is_an_events_fault_and_a_read_only_database_is_not():
    assert values_at_fault(_wrapped(psycopg.errors.InvalidTextRepresentation("invalid input syntax")))
    assert values_at_fault(_wrapped(psycopg.errors.UniqueViolation("duplicate key")))
    assert not values_at_fault(_wrapped(psycopg.errors.ReadOnlySqlTransaction("read-only")))
    assert not values_at_fault(_wrapped(psycopg.errors.UndefinedColumn("no such column")))
    assert isinstance(_wrapped(psycopg.errors.InvalidTextRepresentation("x")), DataError)


def test_a_one_shot_command_on_a_read_only_database_exits_unreachable_with_one_line():
    found = diagnose(_wrapped(psycopg.errors.ReadOnlySqlTransaction(
        "cannot execute UPDATE in a read-only transaction")))
    assert found.code == ExitCode.UNREACHABLE
    assert found.line == "lapse: database unavailable (read-only): cannot execute UPDATE in a read-only transaction"


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


def test_a_long_outage_names_what_is_away_and_keeps_saying_so(caplog):
    now = [0.0]
    settings = load_settings(kafka={"bootstrap_servers": "127.0.0.1:9"},
                             database={"url": "postgresql+psycopg://lapse:pw@db.example:5433/shop?password=pw"})
    outage = Outage("run", logging.getLogger("lapse.test"), settings=settings, base_s=0.001, cap_s=0.002,
                    repeat_s=30.0, clock=lambda: now[0])
    broker_away = KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))
    with caplog.at_level(logging.DEBUG, logger="lapse.test"):
        for now[0] in (0.0, 10.0, 20.0, 31.0, 45.0, 62.0):
            outage.wait(broker_away, threading.Event())
        outage.over()
        outage.wait(OperationalError("SELECT 1", {}, Exception("connection refused")), threading.Event())
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "run: dependency unavailable, retrying with backoff until it is back: kafka at 127.0.0.1:9 unreachable",
        "run: still unavailable after 31 s, retrying: kafka at 127.0.0.1:9 unreachable",
        "run: still unavailable after 62 s, retrying: kafka at 127.0.0.1:9 unreachable",
        "run: dependency unavailable, retrying with backoff until it is back: database "
        "postgresql://db.example:5433/shop unavailable (connection lost)"]


def test_an_outage_of_the_database_says_why_in_its_one_warning(caplog):
    outage = Outage("processor", logging.getLogger("lapse.test"), base_s=0.001, cap_s=0.002)
    read_only = _wrapped(psycopg.errors.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"))
    with caplog.at_level(logging.DEBUG, logger="lapse.test"):
        for _ in range(5):
            outage.wait(read_only, threading.Event())
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert (warning.database, warning.sqlstate, warning.error_type) == ("read-only", "25006", "InternalError")


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
