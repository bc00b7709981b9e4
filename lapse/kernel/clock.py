"""The one clock: the database's. Every decision about time that changes state reads `now` here,
once per transaction (PostgreSQL's `now()` is the transaction's start, so one read is one `now`
for the whole batch); a worker's own clock is for logs, metrics and displays. See
docs/design/clock.md.

A caller may pass a settable now (`clock`, a test's fake clock): then that is the transaction's
now, and the database is not asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Connection, Engine, text

Clock = Callable[[], datetime]  # a settable now: aware UTC

# SQLite (the embedded demo's local file) has no server clock apart from the machine's: its own
# `strftime('now')` keeps the statement the database's all the same.
_SQLITE_NOW = text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
_POSTGRES_NOW = text("SELECT now()")
_POSTGRES_CLOCK = text("SELECT clock_timestamp()")


def database_now(conn: Connection) -> datetime:
    """The database's now on `conn` (PostgreSQL: its transaction's start), aware UTC."""
    if conn.dialect.name == "sqlite":
        return datetime.fromisoformat(conn.execute(_SQLITE_NOW).scalar_one()).replace(tzinfo=UTC)
    value: datetime = conn.execute(_POSTGRES_NOW).scalar_one()
    return value.astimezone(UTC)


def database_clock(conn: Connection) -> datetime:
    """The database's clock at this statement (PostgreSQL: `clock_timestamp()`, not the
    transaction's start: what a decision taken after waiting for a lock must read), aware UTC."""
    if conn.dialect.name == "sqlite":
        return database_now(conn)
    value: datetime = conn.execute(_POSTGRES_CLOCK).scalar_one()
    return value.astimezone(UTC)


def now_in(conn: Connection, clock: Clock | None = None) -> datetime:
    """The now of the transaction on `conn`: `clock()` when one is set, else the database's."""
    return clock() if clock is not None else database_now(conn)


def engine_now(engine: Engine, clock: Clock | None = None) -> datetime:
    """A pass's now (`clock()`, else the database's, read on a connection of its own)."""
    if clock is not None:
        return clock()
    with engine.connect() as conn:
        return database_now(conn)


def measure_skew(conn: Connection) -> float:
    """How far this machine's wall clock is ahead of the database's, in seconds (negative:
    behind): the database's `clock_timestamp()` against the local clock at the middle of the
    round trip. 0 on SQLite, whose clock is this machine's."""
    if conn.dialect.name == "sqlite":
        return 0.0
    conn.execute(text("SELECT 1"))  # connected and in a transaction: the round trip is one statement
    before = time.time()
    theirs: datetime = conn.execute(_POSTGRES_CLOCK).scalar_one()
    after = time.time()
    return (before + after) / 2 - theirs.timestamp()
