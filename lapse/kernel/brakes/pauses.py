"""Pauses: which kinds, and which tenants of a kind, must not run an effect now, since when, by whom
and why. A handful of rows in `lapse_pauses`, read whole (`read_pauses`) once per batch transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, delete, select
from sqlalchemy.dialects import postgresql, sqlite

from lapse.kernel.models import pauses as P

OPERATOR, BUDGET = "operator", "budget"  # who put the brake on: a person, or a spent budget
REASONS = (OPERATOR, BUDGET)
EVERY_TENANT = ""  # the tenant column of a pause of the whole kind


@dataclass(frozen=True, slots=True)
class Pause:
    """One brake in force: `kind` (all its tenants when `tenant` is EVERY_TENANT), why (`reason`:
    operator or budget, `note`: in words), by whom, since when (the database's clock)."""

    kind: str
    tenant: str
    reason: str
    note: str
    actor: str
    since: datetime

    @property
    def whole_kind(self) -> bool:
        return self.tenant == EVERY_TENANT

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "tenant": self.tenant or None, "reason": self.reason, "note": self.note,
                "actor": self.actor, "since": self.since.isoformat()}


@dataclass(frozen=True)
class Pauses:
    """The pauses in force, by (kind, tenant)."""

    by_key: dict[tuple[str, str], Pause]

    @classmethod
    def of(cls, pauses: Iterable[Pause]) -> Pauses:
        return cls({(p.kind, p.tenant): p for p in pauses})

    def holding(self, kind: str, tenant: str) -> Pause | None:
        """The pause that holds work of `kind` for `tenant` (the whole kind's first), or None."""
        return self.by_key.get((kind, EVERY_TENANT)) or self.by_key.get((kind, tenant))

    def __bool__(self) -> bool:
        return bool(self.by_key)

    def __iter__(self) -> Iterator[Pause]:
        return iter(sorted(self.by_key.values(), key=lambda p: (p.kind, p.tenant)))


def read_pauses(conn: Connection) -> Pauses:
    """Every pause in force."""
    rows = conn.execute(select(P.c.kind, P.c.tenant, P.c.reason, P.c.note, P.c.actor, P.c.since))
    return Pauses.of(Pause(*row) for row in rows)


def add_pause(conn: Connection, pause: Pause) -> bool:
    """Put `pause` in force; one already in force on the same kind and tenant is kept as it was
    (its since, actor and reason). Returns whether this one was added."""
    values = {"kind": pause.kind, "tenant": pause.tenant, "reason": pause.reason, "note": pause.note,
              "actor": pause.actor, "since": pause.since}
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    stmt = insert(P).values(**values).on_conflict_do_nothing(index_elements=["kind", "tenant"])
    return conn.execute(stmt.returning(P.c.kind)).first() is not None


def remove_pause(conn: Connection, kind: str, tenant: str) -> Pause | None:
    """Lift the pause on `kind` for `tenant` (EVERY_TENANT: the whole kind's); returns it, or None
    when there was none."""
    stmt = (delete(P).where(P.c.kind == kind, P.c.tenant == tenant)
            .returning(P.c.kind, P.c.tenant, P.c.reason, P.c.note, P.c.actor, P.c.since))
    row = conn.execute(stmt).first()
    return Pause(*row) if row is not None else None
