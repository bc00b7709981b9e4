"""Outages: which failures a long-running role waits out, and how it waits.

One classification for every role (processor, delay worker, relay, sweep, reconciler):
`is_transient(exc)` is True for a dependency that is away or slow — the database (connection
lost or refused, statement timeout), the broker (any non-fatal client error, an unacknowledged
produce that is not refused for good), the schema registry (network error, timeout, 5xx, 429) —
and False for what no retry cures (bad SQL, a fatal or permanent Kafka error, an unknown schema
id, a bug). A role rewinds and waits out the first kind with `Outage`, a capped and jittered
backoff that logs one warning when an outage starts and one info line when it ends, not one per try.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from lapse.kernel.codec import DecodeError
from lapse.kernel.kafka_clients import PERMANENT_ERRORS, DeliveryFailed
from lapse.kernel.schema_registry import SchemaRegistryError

# The first wait of an outage and the longest one (seconds); each failure doubles the wait.
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
# The error text an outage's warning carries, at most.
ERROR_CHARS = 300


def is_transient(exc: BaseException) -> bool:
    """True when retrying the same work later may succeed (a dependency away or slow)."""
    if isinstance(exc, DBAPIError):
        # Lost or refused connections, statement timeouts (psycopg's QueryCanceled is an
        # OperationalError) and any error on a connection the pool has invalidated.
        return isinstance(exc, (OperationalError, InterfaceError)) or bool(exc.connection_invalidated)
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


def backoff_s(failures: int, *, base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S,
              rng: Callable[[], float] = random.random) -> float:
    """The wait after the `failures`-th failure in a row: base·2^(failures-1), capped, then jittered
    into its upper half (so roles that failed together do not retry together, and a wait is never
    less than half the nominal one)."""
    nominal: float = min(cap_s, base_s * 2.0 ** min(max(failures, 1) - 1, 32))
    return nominal * (0.5 + 0.5 * rng())


class Outage:
    """One role's current outage: how many tries failed in a row and since when. `wait(exc, stop)`
    sleeps the next backoff (ending early when `stop` is set); `over()` after a success."""

    def __init__(self, role: str, log: logging.Logger, *, base_s: float = BACKOFF_BASE_S,
                 cap_s: float = BACKOFF_CAP_S, rng: Callable[[], float] = random.random) -> None:
        self.role = role
        self.log = log
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
        if self.failures == 1:
            self.outages += 1
            self.since = time.monotonic()
            self.log.warning(f"{self.role}: dependency unavailable, retrying with backoff until it is back",
                             extra={**extra, "error_type": type(exc).__name__, "error": error})
        else:
            self.log.debug(f"{self.role}: still unavailable", extra={
                **extra, "failures": self.failures, "retry_in_s": round(delay, 2), "error": error})
        stop.wait(delay)
        return delay

    def over(self) -> None:
        """A try succeeded: end the outage (logged once, with how long it lasted)."""
        if self.failures:
            self.log.info(f"{self.role}: dependency back, resuming", extra={
                "failures": self.failures, "outage_s": round(time.monotonic() - self.since, 1)})
            self.failures = 0
