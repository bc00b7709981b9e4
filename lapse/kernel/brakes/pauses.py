"""Pauses: one row of `lapse_pauses` per paused kind, or tenant of a kind, and the statements on it.

A processor reads the whole set once per batch (`read_pauses`: a handful of rows); a resume deletes
the row, and the parked work is released (`lapse.reconciler.release`). A kind's pause covers every
tenant of it; a tenant's, that tenant's work only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, delete, exists, insert, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from lapse.kernel.batch_sql import run_prepared
from lapse.kernel.database import qualified_name
from lapse.kernel.models import pauses as P

ALL_TENANTS = ""  # the tenant of a pause that covers every tenant of its kind
OPERATOR, BUDGET, UNDECLARED = "operator", "budget", "undeclared"
# Why work waits: paused by an operator or by a spent budget (rows of the table), or of a kind the
# kinds file no longer declares (no row: seen by the processor and `lapse kinds check`).
CAUSES = (OPERATOR, BUDGET, UNDECLARED)
COLUMNS = (P.c.kind, P.c.tenant, P.c.cause, P.c.reason, P.c.actor, P.c.since, P.c.details)


@dataclass(frozen=True)
class Pause:
    """`kind` (every tenant of it when `tenant` is ALL_TENANTS) paused since `since` by `actor`,
    for `cause` (operator or budget), with the words given (`reason`)."""

    kind: str
    tenant: str
    cause: str
    reason: str
    actor: str
    since: datetime
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """How the pause is named in lines and operator actions: `kind` or `kind/tenant`."""
        return self.kind if self.tenant == ALL_TENANTS else f"{self.kind}/{self.tenant}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "tenant": self.tenant or None, "cause": self.cause, "reason": self.reason,
                "actor": self.actor, "since": self.since.isoformat(), "details": self.details}


@dataclass(frozen=True)
class Pauses:
    """The pauses as one batch read them."""

    by_target: Mapping[tuple[str, str], Pause] = field(default_factory=dict)

    def covering(self, kind: str, tenant: str) -> Pause | None:
        """The pause that stops work of `kind` for `tenant`: the kind's own, else the tenant's."""
        return self.by_target.get((kind, ALL_TENANTS)) or self.by_target.get((kind, tenant))

    def __bool__(self) -> bool:
        return bool(self.by_target)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(self.by_target.values(), key=lambda p: (p.kind, p.tenant)))


def read_pauses(conn: Connection) -> Pauses:
    """Every pause: the table is a handful of rows, read whole."""
    return Pauses({(row[0], row[1]): Pause(*row) for row in conn.execute(select(*COLUMNS))})


_NOW_AND_PAUSES = ("SELECT now(), p.kind, p.tenant, p.cause, p.reason, p.actor, p.since, p.details "
                   "FROM (SELECT 1) AS one LEFT JOIN {pauses} AS p ON true")


def now_and_pauses(conn: Connection) -> tuple[datetime, Pauses]:
    """The database's now (its transaction's start) and every pause, in one round trip on
    PostgreSQL: what a batch reads first (`lapse.kernel.clock.database_now`, `read_pauses`)."""
    sql = _NOW_AND_PAUSES.format(pauses=qualified_name(conn, P))
    rows = run_prepared(conn, sql, {})
    pauses = {(row[1], row[2]): Pause(*row[1:]) for row in rows if row[1] is not None}
    return rows[0][0].astimezone(UTC), Pauses(pauses)


def insert_pause(conn: Connection, pause: Pause) -> bool:
    """Record `pause` unless its kind (and tenant) is paused already; whether it was recorded."""
    values = {c.name: getattr(pause, c.name) for c in COLUMNS}
    if conn.dialect.name in ("postgresql", "sqlite"):
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(P).values(values).on_conflict_do_nothing().returning(P.c.kind)
        return conn.execute(stmt).first() is not None
    conn.execute(insert(P).values(values))  # pragma: no cover - the two dialects Lapse runs on
    return True


def delete_pause(conn: Connection, kind: str, tenant: str) -> Pause | None:
    """Remove the pause of `kind` (and `tenant`); the pause removed, or None when there was none."""
    stmt = delete(P).where(P.c.kind == kind, P.c.tenant == tenant).returning(*COLUMNS)
    row = conn.execute(stmt).first()
    return None if row is None else Pause(*row)


def covered(kind: ColumnElement[Any], tenant: ColumnElement[Any]) -> ColumnElement[bool]:
    """EXISTS a pause covering work of `kind` for `tenant` (columns of the caller's select)."""
    return exists().where(P.c.kind == kind, or_(P.c.tenant == ALL_TENANTS, P.c.tenant == tenant))
