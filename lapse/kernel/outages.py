"""Outages: which failures a long-running role waits out, and how it waits.

One classification for every role (processor, delay worker, relay, sweep, reconciler, prune,
report, console): `is_transient(exc)` is True for a dependency that is away or slow — the
database (connection lost or refused, statement timeout, read-only or failing over: by SQLSTATE,
`database_outage`), the broker (any non-fatal client error, an unacknowledged produce that is not
refused for good), the schema registry (network error, timeout, 5xx, 429) — and False for what
no retry cures (bad SQL, a fatal or permanent Kafka error, an unknown schema id, a bug). A role
rewinds and waits out the first kind with `Outage`, a capped and jittered backoff that logs one
warning when an outage starts, naming what is away (`kafka at host:9092 unreachable`), another
every REPEAT_WARNING_S while it lasts, and one info line when it ends, not one per try.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from lapse.kernel.codec import DecodeError
from lapse.kernel.kafka_clients import PERMANENT_ERRORS, DeliveryFailed
from lapse.kernel.schema_registry import SchemaRegistryError
from lapse.kernel.settings import Settings

# The first wait of an outage and the longest one (seconds); each failure doubles the wait.
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 10.0
# The error text an outage's warning carries, at most.
ERROR_CHARS = 300
# While an outage lasts, its warning is repeated this often (seconds), with how long it has lasted.
REPEAT_WARNING_S = 30.0
# How many causes deep an error is searched for the outage it was raised while meeting.
CAUSES_FOLLOWED = 5


# The SQLSTATEs of a database that is away, failing over or read-only for a while: whatever the
# DB-API class psycopg gives them (25006 is an InternalError), retrying the same work later may
# succeed, and no event is at fault. When each comes: docs/design/failures.md, "The database fails over".
OUTAGE_SQLSTATES = {
    "25006": "read-only",  # read_only_sql_transaction: a replica, a demoted primary, a read-only database
    "57P01": "shutting down",  # admin_shutdown: the session was terminated (failover, pg_terminate_backend)
    "57P02": "shutting down",  # crash_shutdown: another backend crashed, the server restarts
    "57P03": "starting up",  # cannot_connect_now: starting up, shutting down or in recovery
    "57P05": "shutting down",  # idle_session_timeout
    "57014": "timed out",  # query_canceled: statement_timeout, or a replica's recovery conflict
    "40001": "conflict",  # serialization_failure (also a replica's recovery conflict)
    "40P01": "conflict",  # deadlock_detected
    "55P03": "busy",  # lock_not_available: lock_timeout
    "53300": "busy",  # too_many_connections
}
# A transaction that lost to another one (or to a replica's recovery): worth redoing at once.
CONFLICT_SQLSTATES = frozenset({"40001", "40P01"})
# SQLSTATE classes that are outages as a whole: 08, connection exceptions.
OUTAGE_SQLSTATE_CLASSES = {"08": "connection lost"}


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE PostgreSQL sent with `exc` (a psycopg error, or SQLAlchemy's wrapper of one)."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    state = getattr(orig, "sqlstate", None)
    return state if isinstance(state, str) else None


def database_outage(exc: BaseException) -> str | None:
    """Why `exc` is the database being away or unable to write for now ("read-only", "connection
    lost", …), or None when it is not: bad SQL, a missing table, a permission, a value refused."""
    state = sqlstate(exc)
    if state is not None and (reason := OUTAGE_SQLSTATES.get(state) or OUTAGE_SQLSTATE_CLASSES.get(state[:2])):
        return reason
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return "connection lost"  # the pool saw a disconnect, whatever the error said
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if isinstance(exc, (OperationalError, InterfaceError)) or isinstance(
            orig, (psycopg.OperationalError, psycopg.InterfaceError)):
        # No SQLSTATE: refused, reset or closed by the server mid-transaction. With one: the
        # server short of a resource (classes 53, 55, 57, 58); SQLite's file locked.
        return "connection lost" if state is None else "unavailable"
    return None


def is_conflict(exc: BaseException) -> bool:
    """Whether a transaction failed on a deadlock or a serialization failure: redone at once, a
    few times, before it counts as an outage."""
    return sqlstate(exc) in CONFLICT_SQLSTATES


# Every class of error `is_transient` may call an outage, for a handler that must be keyed by class.
OUTAGE_ERRORS: tuple[type[Exception], ...] = (DBAPIError, psycopg.Error, PoolTimeout, DeliveryFailed,
                                              KafkaException, SchemaRegistryError, DecodeError)


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same work later may succeed (a dependency away or slow)."""
    if not isinstance(exc, OUTAGE_ERRORS):
        return False
    if isinstance(exc, (DBAPIError, psycopg.Error)):
        return database_outage(exc) is not None
    if isinstance(exc, PoolTimeout):  # every pooled connection busy for pool_timeout
        return True
    if isinstance(exc, DeliveryFailed):
        return not exc.permanent
    if isinstance(exc, KafkaException):
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError):
            return True  # the client gave no code: treat it as the broker being away
        return not err.fatal() and err.code() not in PERMANENT_ERRORS
    if isinstance(exc, SchemaRegistryError):
        return exc.transient
    if isinstance(exc, DecodeError):
        return exc.transient
    return False


def outage_in(exc: BaseException) -> BaseException | None:
    """`exc` or the error it was raised from or while handling (a few steps down) that is an outage."""
    seen: BaseException | None = exc
    for _ in range(CAUSES_FOLLOWED):
        if seen is None:
            return None
        if is_transient(seen):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _database_named(settings: Settings) -> str:
    """The database as an operator names it: backend, host, port and name (no user, password or query)."""
    try:
        url = make_url(settings.database.url_plain())
    except ArgumentError:
        return "database"
    if url.get_backend_name() == "sqlite":
        return f"database {url.database}"
    where = f"{url.host or 'localhost'}" + (f":{url.port}" if url.port else "")
    return f"database {url.get_backend_name()}://{where}/{url.database or ''}"


def dependency_named(exc: BaseException, settings: Settings | None) -> str:
    """What is away, for the outage's warning: `kafka at host:9092 unreachable`, `database
    postgresql://host:5432/shop unavailable (read-only)`, the schema registry's own message."""
    found = outage_in(exc) or exc
    if isinstance(found, (DBAPIError, psycopg.Error, PoolTimeout)):
        database = _database_named(settings) if settings is not None else "database"
        return f"{database} unavailable ({database_outage(found) or 'busy'})"
    if isinstance(found, (KafkaException, DeliveryFailed)):
        return f"kafka at {settings.kafka.bootstrap_servers} unreachable" if settings is not None \
            else "kafka unreachable"
    return " ".join(str(found).split())[:ERROR_CHARS] or type(found).__name__


def backoff_s(failures: int, *, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S,
              rng: Callable[[], float] = random.random) -> float:
    """The wait after the `failures`-th failure in a row: base·2^(failures-1), capped, then jittered
    into its upper half (so roles that failed together do not retry together, and a wait is never
    less than half the nominal one)."""
    nominal: float = min(cap_s, base_s * 2.0 ** min(max(failures, 1) - 1, 32))
    return nominal * (0.5 + 0.5 * rng())


class Outage:
    """One role's current outage: how many tries failed in a row and since when. `wait(exc, stop)`
    sleeps the next backoff (ending early when `stop` is set); `over()` after a success. With
    `settings` the warnings name the broker or database at their address."""

    def __init__(self, role: str, log: logging.Logger, *, settings: Settings | None = None,
                 base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S, rng: Callable[[], float] = random.random,
                 repeat_s: float = REPEAT_WARNING_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.role = role
        self.log = log
        self.settings = settings
        self.repeat_s = repeat_s
        self.clock = clock
        self.warned = 0.0  # when the outage's warning was last logged
        self.base_s = base_s
        self.cap_s = cap_s
        self.rng = rng
        self.failures = 0
        self.outages = 0  # outages seen so far (each logged once)
        self.since = 0.0

    def wait(self, exc: BaseException, stop: threading.Event, **extra: Any) -> float:
        """Note a transient failure and wait the next backoff; returns the wait in seconds."""
        self.failures += 1
        delay = backoff_s(self.failures, base_s=self.base_s, cap_s=self.cap_s, rng=self.rng)
        error = " ".join(str(exc).split())[:ERROR_CHARS] or type(exc).__name__
        now = self.clock()
        if self.failures == 1:
            self.outages += 1
            self.since = self.warned = now
            fields = {**extra, "error_type": type(exc).__name__, "error": error}
            if (database := database_outage(exc)) is not None:  # "read-only", "connection lost", …
                fields.update(database=database, sqlstate=sqlstate(exc))
            self.log.warning(f"{self.role}: dependency unavailable, retrying with backoff until it is back: "
                             f"{dependency_named(exc, self.settings)}", extra=fields)
        elif now - self.warned >= self.repeat_s:
            self.warned = now
            self.log.warning(f"{self.role}: still unavailable after {now - self.since:.0f} s, retrying: "
                             f"{dependency_named(exc, self.settings)}", extra={**extra, "error": error})
        else:
            self.log.debug(f"{self.role}: still unavailable", extra={
                **extra, "failures": self.failures, "retry_in_s": round(delay, 2), "error": error})
        stop.wait(delay)
        return delay

    def over(self) -> None:
        """A try succeeded: end the outage (logged once, with how long it lasted)."""
        if self.failures:
            self.log.info(f"{self.role}: dependency back, resuming", extra={
                "failures": self.failures, "outage_s": round(self.clock() - self.since, 1)})
            self.failures = 0
