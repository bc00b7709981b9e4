"""Blast-radius budgets: at most `max_effects` effects of a kind (or of each tenant of it) in any
window of `per_s` seconds, counted in the database for every worker at once.

A batch that is about to apply effects of a budgeted kind takes the kind's lock (a transaction
advisory lock on PostgreSQL, held until it commits; SQLite has one writer at a time), counts the
usage rows of the window and records its own at the latest time its effects can happen: the end of
its statements, or the end of the lease for an external effect. docs/design/brakes.md argues why
no window then holds more than `max_effects`.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Interval, delete, func, insert, literal, select, text

from lapse.kernel.models import UTCDateTime
from lapse.kernel.models import budget_usage as U

# The advisory lock's first key: Lapse's budgets (the second is the kind's checksum).
BUDGET_LOCK = 0x1A95E
# How long usage is kept past its window (then deleted by the next batch of its kind).
KEEP_PAST_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Budget:
    """At most `max_effects` effects in any `per_s` seconds, of the kind or of each tenant of it."""

    max_effects: int
    per_s: float
    per_tenant: bool = False

    def text(self) -> str:
        """`1000 per 1m`, as the kinds file and the lines say it."""
        per = next((f"{self.per_s / s:g}{u}" for s, u in ((86400, "d"), (3600, "h"), (60, "m"))
                    if self.per_s >= s and self.per_s % s == 0), f"{self.per_s:g}s")
        return f"{self.max_effects} per {per}" + (" per tenant" if self.per_tenant else "")


def lock_budget(conn: Connection, kind: str) -> None:
    """Hold `kind`'s budget lock until this transaction ends (PostgreSQL; SQLite needs none)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:space, :key)"),
                     {"space": BUDGET_LOCK, "key": zlib.crc32(kind.encode()) - 2**31})


def used_in_window(conn: Connection, kind: str, tenant: str, budget: Budget, now: datetime) -> int:
    """The effects of `kind` (for `tenant`) the usage rows put after `now` minus the window; usage
    far past it is deleted on the way (the row count stays about one window's batches)."""
    window_start = now - timedelta(seconds=budget.per_s)
    conn.execute(delete(U).where(U.c.kind == kind, U.c.tenant == tenant, U.c.at < window_start - KEEP_PAST_WINDOW))
    used = conn.execute(select(func.coalesce(func.sum(U.c.effects), 0))
                        .where(U.c.kind == kind, U.c.tenant == tenant, U.c.at > window_start)).scalar_one()
    return int(used)


def record_usage(conn: Connection, kind: str, tenant: str, effects: int, now: datetime,
                 ahead: timedelta = timedelta(0)) -> None:
    """Count `effects` of `kind` (for `tenant`) at the latest time they can happen: this
    transaction's `now` plus the time it has taken so far (the database's clock), plus `ahead`
    (the lease of an external effect)."""
    if effects <= 0:
        return
    if conn.dialect.name == "postgresql":
        at = literal(now, UTCDateTime()) + (func.clock_timestamp() - func.now()) + literal(ahead, Interval())
        conn.execute(insert(U).values(kind=kind, tenant=tenant, at=at, effects=effects))
        return
    # SQLite, one writer at a time: the process's clock is the database's (lapse.kernel.clock).
    conn.execute(insert(U).values(kind=kind, tenant=tenant, at=max(now, datetime.now(UTC)) + ahead,
                                  effects=effects))


def forget_usage(conn: Connection, kind: str, tenant: str | None = None) -> int:
    """An operator's resume of a spent budget starts a new window: `kind`'s usage (one tenant's,
    when given) is deleted. Returns how many rows went."""
    stmt = delete(U).where(U.c.kind == kind)
    if tenant is not None:
        stmt = stmt.where(U.c.tenant == tenant)
    return conn.execute(stmt).rowcount
