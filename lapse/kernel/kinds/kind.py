"""What a cleanup kind is, whichever way it was made: plain data plus functions over a connection.

The sweep, the processors and the reconciler use only this interface, so a kind compiled from a
declaration in the kinds file and a Python kind named by dotted path behave the same to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, NamedTuple

from pydantic import BaseModel
from sqlalchemy import Column, ColumnElement, Connection, Select, Table, case, false, select, true, tuple_
from sqlalchemy.sql.elements import NamedColumn
from sqlalchemy.sql.util import find_tables

from lapse.kernel.batch_sql import any_of
from lapse.kernel.brakes import Budget
from lapse.kernel.kinds.statements import due_rows
from lapse.kernel.ledger import has_row_not_waiting_past, op_key

FULL_TENANT, FULL_ELIGIBLE = "lapse_full_tenant", "lapse_full_eligible"  # labels of `full_rows`' extras


@dataclass(frozen=True, slots=True)
class EffectCall:
    """One attempt of an external effect for one operation. `target` holds the business row's
    values (column → value) read when the row was claimed."""

    kind: str
    op_key: str
    attempt: int
    subject_id: str
    tenant: str
    target: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class EligibleRow:
    """A business row whose cleanup is due."""

    subject_id: str
    tenant: str
    due_at: datetime
    cursor: tuple[Any, ...]


class SubjectRow(NamedTuple):
    """A business row as it stands, due or not: the processor checks an event against it (the
    tenant must match; the row, not the event, says when the work is due). A named tuple: a batch
    makes one per event, on its hot path."""

    tenant: str
    due_at: datetime
    eligible: bool  # the kind's business condition holds (the due time aside)


@dataclass(frozen=True)
class ExternalEffect:
    """An effect outside the database, run under a lease.

    `targets` reads, for the subjects still eligible and due, the business row's values (subject
    id → column → value) the call needs; `complete` records the done effect on the business rows
    still eligible, in the completion transaction, and returns the subject ids done. A declared
    effect carries its validated declaration in `declared` (one of the effect types of
    `lapse.kernel.kinds.effects`); a Python kind brings its own `call`.
    """

    targets: Callable[[Connection, list[Any], datetime], dict[str, dict[str, Any]]]
    complete: Callable[[Connection, list[Any], datetime], set[str]]
    declared: BaseModel | None = None
    call: Callable[[EffectCall], object] | None = None


@dataclass(frozen=True)
class CleanupKind:
    """One kind of cleanup. `apply_in_db` runs inside the claim transaction and returns the subject
    ids it changed (the rest are skipped: someone else won the race). Kinds whose effect lives
    outside the database set `external_effect` instead (run under a lease). `tenant_column` is a
    column of the table or, for a table without one, a labelled constant."""

    name: str
    table: Table
    id_column: Column[Any]
    tenant_column: NamedColumn[Any]
    due_column: Column[Any]
    still_eligible: ColumnElement[bool]  # the business condition, without the due time
    parse_subject: Callable[[str], Any]
    apply_in_db: Callable[[Connection, list[Any], datetime], set[str]] | None = None
    external_effect: ExternalEffect | None = None
    max_attempts: int = 6
    retry_base_s: float = 5.0
    retry_cap_s: float = 3600.0
    idempotent_effect: bool = True
    effect_rate_per_s: float = 100.0  # token-bucket rate of external effects, per worker
    # How long an operation may keep being rate-limited (429s burn no attempt), from its first
    # failed attempt: past it, the next rate-limited failure is a dead letter (`rate_limited`).
    rate_limited_for_s: float = 86_400.0
    mode: str = "live"  # or "shadow": the effect replaced by a record of what it would do
    budget: Budget | None = None  # at most so many effects in any window, counted in the database

    @property
    def shadow(self) -> bool:
        return self.mode == "shadow"

    def op_key(self, subject_id: Any) -> str:
        return op_key(self.name, subject_id)

    def due_clause(self, now: datetime) -> ColumnElement[bool]:
        """A row the kind's effect may change at `now`: still eligible and due (the clause the
        declared effects' statements apply, `statements.due_rows`)."""
        return due_rows(self.still_eligible, self.due_column, now)

    def eligible_page(
        self, now: datetime, after: tuple[Any, ...] | None, limit: int, *, without_ledger: bool
    ) -> Select[Any, Any, Any]:
        """Due rows in keyset order (due time, id) after `after`; optionally only those the sweep
        must emit (no ledger row yet, or a `pending` one still waiting past `now`: an event's own
        far-off due time, or a subject that did not exist when its event came), or all of them
        (the reconciler's anomaly checks)."""
        cols = (self.due_column, self.id_column)
        stmt = select(self.id_column, self.tenant_column, self.due_column).where(self.due_clause(now))
        if after is not None:
            stmt = stmt.where(tuple_(*cols) > tuple_(*after))
        if without_ledger:
            stmt = stmt.where(~has_row_not_waiting_past(self.name, self.id_column, now))
        return stmt.order_by(*cols).limit(limit)

    def not_yet_due(self, conn: Connection, subjects: list[Any], now: datetime) -> dict[str, datetime]:
        """Subjects still eligible whose due time is now in the future (a hold was extended after
        its event was produced): subject id → the new due time."""
        stmt = select(self.id_column, self.due_column).where(
            any_of(conn, self.id_column, subjects, self.id_column.type), self.still_eligible, self.due_column > now)
        return {str(subject): due for subject, due in conn.execute(stmt)}

    @cached_property
    def has_tenant(self) -> bool:
        """Whether the tenant is read from the table (a constant stands in when it has none)."""
        return bool(find_tables(self.tenant_column, check_columns=True))

    def subject_rows(self, conn: Connection, subjects: list[Any]) -> dict[str, SubjectRow]:
        """The business rows of `subjects` that exist, eligible or not: subject id → tenant, due
        time, eligibility. A subject left out has no business row (yet)."""
        if not subjects:
            return {}
        eligible = case((self.still_eligible, true()), else_=false())
        stmt = select(self.id_column, self.tenant_column, self.due_column, eligible).where(
            any_of(conn, self.id_column, subjects, self.id_column.type))
        return {str(subject): SubjectRow(str(tenant), due, bool(ok))
                for subject, tenant, due, ok in conn.execute(stmt)}

    def full_rows(self, conn: Connection, subjects: list[Any]) -> dict[str, tuple[SubjectRow, dict[str, Any]]]:
        """The business rows of `subjects` as `subject_rows` reads them, each with every column's
        value (what a shadow run shows its effect would change)."""
        if not subjects:
            return {}
        eligible = case((self.still_eligible, true()), else_=false())
        stmt = select(*self.table.columns, self.tenant_column.label(FULL_TENANT), eligible.label(FULL_ELIGIBLE)
                      ).where(any_of(conn, self.id_column, subjects, self.id_column.type))
        out = {}
        for row in conn.execute(stmt):
            values = row._mapping
            columns = {c.name: values[c] for c in self.table.columns}
            subject = str(columns[self.id_column.name])
            out[subject] = (SubjectRow(str(values[FULL_TENANT]), columns[self.due_column.name],
                                       bool(values[FULL_ELIGIBLE])), columns)
        return out

    def to_eligible(self, row: Sequence[Any]) -> EligibleRow:
        subject, tenant, due = row
        return EligibleRow(str(subject), str(tenant), due, (due, subject))
