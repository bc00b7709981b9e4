"""What a cleanup kind is, whichever way it was made: plain data plus functions over a connection.

The sweep, the processors and the reconciler use only this interface, so a kind compiled from a
declaration in the kinds file and a Python kind named by dotted path behave the same to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, NamedTuple

from pydantic import BaseModel
from sqlalchemy import Column, ColumnElement, Connection, Select, Table, and_, case, false, func, select, true, tuple_
from sqlalchemy.sql.elements import Label, NamedColumn
from sqlalchemy.sql.util import find_tables

from lapse.kernel.batch_sql import any_of, any_of_bound, batch_values
from lapse.kernel.brakes import Budget
from lapse.kernel.kinds.generations import Generation
from lapse.kernel.kinds.limits import Limits
from lapse.kernel.kinds.statements import due_rows, on_each_row
from lapse.kernel.ledger import (
    GENERATION_MARK,
    ExpiryEvent,
    InvalidOpKey,
    expiry_event,
    has_row_not_waiting_past,
    op_key,
)

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
    traceparent: str | None = None  # the W3C trace context the far side is sent (`traceparent` header)


@dataclass(frozen=True, slots=True)
class EligibleRow:
    """A business row whose cleanup is due, with its generation's text for a kind that has one."""

    subject_id: str
    tenant: str
    due_at: datetime
    cursor: tuple[Any, ...]
    generation: str | None = None


class SubjectRow(NamedTuple):
    """A business row as it stands, due or not: the processor checks an event against it (the
    tenant must match; the row, not the event, says when the work is due). A named tuple: a batch
    makes one per event, on its hot path."""

    tenant: str
    due_at: datetime
    eligible: bool  # the kind's business condition holds (the due time aside), and of the asked generation


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
    column of the table or, for a table without one, a labelled constant.

    A kind with a `generation` names each lapse of a row apart: its subjects, as `parse_key` gives
    them to every function here and to the effect, are (id, generation) pairs, and what the
    functions return is keyed by `<id>@<generation>` (the op key's subject part, `subject_key`);
    a row of another generation than the one asked is not eligible for it."""

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
    limits: Limits = field(default_factory=Limits)  # the external effect's calls, for every worker at once
    priority: str = "normal"  # or "high": swept, and called, ahead of normal kinds
    tenant_weights: Mapping[str, float] = field(default_factory=dict)  # the sweep's shares (1 if unnamed)
    # How long an operation may keep being rate-limited (429s burn no attempt), from its first
    # failed attempt: past it, the next rate-limited failure is a dead letter (`rate_limited`).
    rate_limited_for_s: float = 86_400.0
    mode: str = "live"  # or "shadow": the effect replaced by a record of what it would do
    budget: Budget | None = None  # at most so many effects in any window, counted in the database
    generation: Generation | None = None  # what tells one lapse of a row from the next

    @property
    def shadow(self) -> bool:
        return self.mode == "shadow"

    @property
    def high_priority(self) -> bool:
        return self.priority == "high"

    def op_key(self, subject_id: Any, generation: str | None = None) -> str:
        """The op key of `subject_id` (and, for a kind with a generation, of its generation's text)."""
        return op_key(self.name, subject_id, generation)

    def row_op_key(self, subject_id: Any, values: Mapping[str, Any]) -> str:
        """The op key of the business row whose columns are `values` (column name → value)."""
        gen = self.generation
        return self.op_key(subject_id, None if gen is None else gen.text(values[gen.name]))

    def parse_key(self, subject_key: str) -> Any:
        """An event's subject as its op key names it (`ExpiryEvent.subject_key`), parsed: the id
        column's value, or (id, generation) for a kind with a generation; ValueError otherwise."""
        subject, mark, generation = subject_key.partition(GENERATION_MARK)
        if self.generation is None:
            if mark:
                raise ValueError(f"kind {self.name!r} declares no generation; its op keys end with the subject id")
            return self.parse_subject(subject)
        if not mark:
            raise ValueError(f"kind {self.name!r} tells its lapses apart by {self.generation.name}: "
                             "its op keys end with @<generation>")
        return self.parse_subject(subject), self.generation.parse(generation)

    def generation_sql(self, source: Any = None) -> ColumnElement[str] | None:
        """The business row's generation as text in SQL (over the same-named column of `source`, a
        subquery of the table, when given); None for a kind without one."""
        gen = self.generation
        if gen is None:
            return None
        return gen.sql_text(gen.column if source is None else source.c[gen.name])

    def _generation_columns(self) -> tuple[Column[Any], ...]:
        return () if self.generation is None else (self.generation.column,)

    def _ids(self, subjects: list[Any]) -> list[Any]:
        return subjects if self.generation is None else [subject for subject, _ in subjects]

    def _asked(self, subjects: list[Any], rows: Mapping[str, Any], at: int) -> Iterator[tuple[str, Any, bool]]:
        """(subject key, row, of the asked generation) for each asked subject whose id has a row in
        `rows` (by id text; the generation at index `at` of a row)."""
        gen = self.generation
        if gen is None:
            yield from ((key, row, True) for key, row in rows.items())
            return
        for subject, generation in subjects:
            row = rows.get(str(subject))
            if row is not None:
                yield gen.key(subject, generation), row, gen.text(row[at]) == gen.text(generation)

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
        stmt = (select(self.id_column, self.tenant_column, self.due_column, *self._generation_columns())
                .where(self.due_clause(now)))
        if after is not None:
            stmt = stmt.where(tuple_(*cols) > tuple_(*after))
        if without_ledger:
            stmt = stmt.where(~has_row_not_waiting_past(self.name, self.id_column, now, self.generation_sql()))
        return stmt.order_by(*cols).limit(limit)

    @property
    def tenant_source(self) -> ColumnElement[Any]:
        """The tenant column itself (a kind's `tenant_column` may be it labelled)."""
        return self.tenant_column.element if isinstance(self.tenant_column, Label) else self.tenant_column

    @property
    def tenant_index_column(self) -> str | None:
        """The tenant column's name when the tenant is read as the column it is (not cast to text,
        nor a null read as 'default'): an index on (tenant, due, id) then serves the sweep's reads
        by tenant. None otherwise."""
        tenant = self.tenant_source
        return tenant.name if isinstance(tenant, Column) and self.has_tenant else None

    def _to_emit(self, now: datetime) -> ColumnElement[bool]:
        """The due rows the sweep must emit: no ledger row yet, or one waiting past `now`."""
        return self.due_clause(now) & ~has_row_not_waiting_past(self.name, self.id_column, now, self.generation_sql())

    def due_tenants(self, now: datetime, limit: int, cap: int, *, walk: bool) -> Select[Any, int]:
        """(tenant, rows) of the due rows the sweep must emit, per tenant, at most `limit` tenants:
        what the sweep's pages share. With `walk` (PostgreSQL), for a tenant read as the column it
        is, the tenants are walked one index probe each (a recursive read of the next tenant after
        the last) and each one's rows counted along its (tenant, due, id) index up to `cap`: bounded
        by the tenants and `cap`, not the backlog (docs/design/limits.md). Else one grouped read of
        the due rows, counted in full."""
        tenant = self.tenant_source
        if not walk or self.tenant_index_column is None:
            return select(tenant, func.count()).where(self._to_emit(now)).group_by(tenant).order_by(tenant).limit(limit)
        first = select(func.min(tenant)).where(self.still_eligible).scalar_subquery()
        tenants = select(first.label("tenant")).cte("lapse_tenants", recursive=True)
        after = select(func.min(tenant)).where(self.still_eligible, tenant > tenants.c.tenant).scalar_subquery()
        tenants = tenants.union_all(select(after).where(tenants.c.tenant.is_not(None)))
        rows = (select(self.id_column).where(tenant == tenants.c.tenant, self._to_emit(now)).limit(cap)
                .correlate(tenants).subquery())
        n = select(func.count().label("n")).select_from(rows).lateral()
        return (select(tenants.c.tenant, n.c.n).join(n, true()).where(tenants.c.tenant.is_not(None), n.c.n > 0)
                .order_by(tenants.c.tenant).limit(limit))

    def tenant_page(self, now: datetime, tenants: list[str], after: tuple[Any, ...] | None,
                    limit: int) -> Select[Any, Any, Any]:
        """The due rows the sweep must emit of `tenants`, in (due, id) order after `after`: one
        tenant's share of a page, read along its (tenant, due, id) index where the table has one
        (docs/design/limits.md)."""
        tenant = self.tenant_source
        cols: tuple[ColumnElement[Any], ...] = (self.due_column, self.id_column)
        stmt = select(self.id_column, self.tenant_column, self.due_column, *self._generation_columns()).where(
            self._to_emit(now))
        keyset = cols
        if self.has_tenant:  # a table without a tenant column has the one tenant
            one = len(tenants) == 1
            stmt = stmt.where(tenant == tenants[0] if one else tenant.in_(tenants))
            # One tenant's cursor as (tenant, due, id): the same rows, where that index can start.
            keyset = (tenant, *cols) if one else cols
            after = (tenants[0], *after) if one and after is not None else after
        if after is not None:
            stmt = stmt.where(tuple_(*keyset) > tuple_(*after))
        return stmt.order_by(*cols).limit(limit)

    def not_yet_due(self, conn: Connection, subjects: list[Any], now: datetime) -> dict[str, datetime]:
        """Subjects still eligible (and of their generation) whose due time is now in the future (a
        hold was extended after its event was produced): subject key → the new due time."""
        stmt = select(self.id_column, self.due_column, *self._generation_columns()).where(
            any_of(conn, self.id_column, self._ids(subjects), self.id_column.type),
            on_each_row(and_(self.still_eligible, self.due_column > now)))
        rows = {str(row[0]): row for row in conn.execute(stmt)}
        return {key: row[1] for key, row, same in self._asked(subjects, rows, 2) if same}

    @cached_property
    def has_tenant(self) -> bool:
        """Whether the tenant is read from the table (a constant stands in when it has none)."""
        return bool(find_tables(self.tenant_column, check_columns=True))

    def subject_rows(self, conn: Connection, subjects: list[Any]) -> dict[str, SubjectRow]:
        """The business rows of `subjects` that exist, eligible or not: subject key → tenant, due
        time, eligibility (false for a row of another generation than asked). A subject left out
        has no business row (yet)."""
        if not subjects:
            return {}
        stmt = self._statements.get(("subject_rows", conn.dialect.name))
        if stmt is None:
            eligible = case((self.still_eligible, true()), else_=false())
            stmt = select(self.id_column, self.tenant_column, self.due_column, eligible, *self._generation_columns()
                          ).where(any_of_bound(conn, self.id_column, "ids", self.id_column.type))
            self._statements[("subject_rows", conn.dialect.name)] = stmt
        found = conn.execute(stmt, {"ids": batch_values(conn, self._ids(subjects))}).all()
        rows = {str(row[0]): row for row in found}
        return {key: SubjectRow(str(row[1]), row[2], bool(row[3]) and same)
                for key, row, same in self._asked(subjects, rows, 4)}

    @cached_property
    def _statements(self) -> dict[tuple[str, str], Any]:
        """The statements every batch runs, built once per dialect (their values bound at execution):
        SQLAlchemy then compiles each once, not once a batch."""
        return {}

    def full_rows(self, conn: Connection, subjects: list[Any]) -> dict[str, tuple[SubjectRow, dict[str, Any]]]:
        """The business rows of `subjects` as `subject_rows` reads them, each with every column's
        value (what a shadow run shows its effect would change)."""
        if not subjects:
            return {}
        eligible = case((self.still_eligible, true()), else_=false())
        stmt = select(*self.table.columns, self.tenant_column.label(FULL_TENANT), eligible.label(FULL_ELIGIBLE)
                      ).where(any_of(conn, self.id_column, self._ids(subjects), self.id_column.type))
        rows = {}
        for row in conn.execute(stmt):
            values = row._mapping
            columns = {c.name: values[c] for c in self.table.columns}
            rows[str(columns[self.id_column.name])] = (
                str(values[FULL_TENANT]), bool(values[FULL_ELIGIBLE]), columns,
                columns[self.generation.name] if self.generation else None)
        return {key: (SubjectRow(tenant, columns[self.due_column.name], ok and same), columns)
                for key, (tenant, ok, columns, _), same in self._asked(subjects, rows, 3)}

    def events_of(self, rows: Sequence[EligibleRow], *, source: str
                  ) -> tuple[list[ExpiryEvent], list[tuple[EligibleRow, str]]]:
        """The events of due `rows`, and the rows set aside with why: an id (or generation) a
        team's table holds that cannot form an op key (a space, a colon, too long) is no work the
        pipeline can name, and must not stop the rows after it."""
        events, aside = [], []
        for r in rows:
            try:
                events.append(expiry_event(self.name, r.subject_id, r.tenant, r.due_at, source=source,
                                           generation=r.generation))
            except InvalidOpKey as exc:
                aside.append((r, str(exc)))
        return events, aside

    def to_eligible(self, row: Sequence[Any]) -> EligibleRow:
        """A row of `eligible_page` (id, tenant, due time and, for a kind with one, generation)."""
        subject, tenant, due, *generation = row
        text = self.generation.text(generation[0]) if self.generation is not None else None
        return EligibleRow(str(subject), str(tenant), due, (due, subject), text)
