"""Time partitions of lapse_transitions (by `at`, weekly) and lapse_outbox (by `created_at`, daily)
on PostgreSQL: how each table is partitioned, the partitions that exist, and the DEFAULT partition
that catches a row no partition covers. Migration 0009 made the tables partitioned and says why
these keys and widths; SQLite has no partitions (every function here that reads the catalog
answers "not partitioned" there, and retention deletes in batches). Creating the partitions ahead
and dropping old ones whole is retention's (`lapse.retention.partitions`).

A partition is named after its lower bound, `lapse_outbox_p20261130` (its bounds are read from
the catalog, never parsed from the name); the DEFAULT one is `lapse_outbox_default`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, MetaData, Table, text

from lapse.kernel.models import SCHEMA
from lapse.kernel.models import ledger_transitions as T
from lapse.kernel.models import outbox as O


@dataclass(frozen=True)
class Scheme:
    """How one table is partitioned: by `key`, in units of `unit_days` (a week starts on Monday,
    UTC), `ahead` units created past the current one."""

    table: Table
    key: str
    unit_days: int
    ahead: int

    @property
    def name(self) -> str:
        return self.table.name

    def floor(self, at: datetime) -> datetime:
        """The start of the unit holding `at` (midnight UTC, a Monday's for weeks)."""
        day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        return day - timedelta(days=day.weekday()) if self.unit_days == 7 else day

    @property
    def unit(self) -> timedelta:
        return timedelta(days=self.unit_days)

    def partition_name(self, lower: datetime) -> str:
        return f"{self.name}_p{lower.astimezone(UTC):%Y%m%d}"

    @property
    def default_name(self) -> str:
        return f"{self.name}_default"

    def default_table(self) -> Table:
        """The DEFAULT partition as a table of its own (same columns), for statements on it alone."""
        return self.table.to_metadata(MetaData(), name=self.default_name)


TRANSITIONS = Scheme(T, "at", 7, 2)
OUTBOX = Scheme(O, "created_at", 1, 7)


@dataclass(frozen=True)
class Partition:
    """One partition: its name, its bounds (None for DEFAULT) and the planner's row estimate (0 for
    an empty file, None when never analyzed)."""

    name: str
    lower: datetime | None
    upper: datetime | None
    rows: int | None

    @property
    def is_default(self) -> bool:
        return self.lower is None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "from": None if self.lower is None else self.lower.isoformat(),
                "to": None if self.upper is None else self.upper.isoformat(), "rows_estimate": self.rows}


_BOUNDS = re.compile(r"FOR VALUES FROM \('([^']+)'\) TO \('([^']+)'\)")


def schema_of(conn: Connection) -> str:
    """The schema Lapse's tables are in on this connection (its translate map's, else the placeholder's)."""
    translate = conn.get_execution_options().get("schema_translate_map") or {}
    return translate.get(SCHEMA) or SCHEMA


def quoted_name(conn: Connection, name: str) -> str:
    """`name` in Lapse's schema on this connection, quoted for a statement."""
    preparer = conn.dialect.identifier_preparer
    return f"{preparer.quote_schema(schema_of(conn))}.{preparer.quote(name)}"


def is_partitioned(conn: Connection, scheme: Scheme) -> bool:
    """Whether `scheme`'s table is a partitioned table here (never on SQLite)."""
    if conn.dialect.name != "postgresql":
        return False
    kind = conn.execute(text(
        "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = :schema AND c.relname = :table"), {"schema": schema_of(conn), "table": scheme.name}).scalar()
    return kind == "p"


def partitions(conn: Connection, scheme: Scheme) -> list[Partition]:
    """The partitions of `scheme`'s table, oldest first, DEFAULT last (rows: the planner's estimate)."""
    found = conn.execute(text(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), "
        "CASE WHEN c.reltuples >= 0 THEN c.reltuples WHEN pg_relation_size(c.oid) = 0 THEN 0 END "
        "FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
        "JOIN pg_namespace n ON n.oid = p.relnamespace WHERE n.nspname = :schema AND p.relname = :table"),
        {"schema": schema_of(conn), "table": scheme.name}).all()
    parts = []
    for name, bound, rows in found:
        m = _BOUNDS.search(bound)
        lower, upper = (datetime.fromisoformat(m.group(1)), datetime.fromisoformat(m.group(2))) if m else (None, None)
        parts.append(Partition(name, lower, upper, None if rows is None else int(rows)))
    return sorted(parts, key=lambda p: (p.lower is None, p.lower or datetime.min.replace(tzinfo=UTC)))


def default_rows(conn: Connection, scheme: Scheme, cap: int) -> int | None:
    """Rows waiting in `scheme`'s DEFAULT partition, counted up to `cap` (a bounded read, for
    status); None where the table is not partitioned."""
    if not is_partitioned(conn, scheme):
        return None
    default = quoted_name(conn, scheme.default_name)
    return int(conn.execute(text(f"SELECT count(*) FROM (SELECT 1 FROM {default} LIMIT :cap) d"),
                            {"cap": cap}).scalar_one())


