"""The statements of declared effects, built by SQLAlchemy over the reflected table.

Every statement is conditional: it touches only the batch's ids whose rows still satisfy the
kind's eligibility (and, for the effect itself, are due: `due_rows`), so a payment or
cancellation that won the race leaves its row alone, and a second delivery changes nothing. Each
returns the subject ids it changed, as strings (the event's subject ids). The effects are objects
rather than closures so that `lapse kinds plan` reads the very clause and values they run with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, Delete, Table, Update, and_, delete, select, update

from lapse.kernel.batch_sql import any_of
from lapse.kernel.kinds.columns import NOW, now_for


def due_rows(eligible: ColumnElement[bool], due_column: Column[Any], now: datetime) -> ColumnElement[bool]:
    """The rows an effect may change at `now`: still eligible and due. The one clause the effects'
    statements, the sweep's pages and the preview share."""
    return and_(eligible, due_column <= now)


def _values(values: Mapping[Column[Any], Any], now: datetime) -> dict[str, Any]:
    return {column.name: now_for(column, now) if value is NOW else value for column, value in values.items()}


@dataclass(frozen=True, eq=False)
class RowsEffect:
    """An in-database effect over the batch's due, still eligible rows: `UPDATE … SET values`, or a
    `DELETE` when `deletes`; called as `apply_in_db(conn, ids, now)`."""

    table: Table
    id_column: Column[Any]
    due_column: Column[Any]
    eligible: ColumnElement[bool]
    values: Mapping[Column[Any], Any] = field(default_factory=dict)
    deletes: bool = False

    def where(self, now: datetime) -> ColumnElement[bool]:
        """The effect's condition on a row at `now`, the batch's ids aside."""
        return due_rows(self.eligible, self.due_column, now)

    def set_values(self, now: datetime) -> dict[str, Any]:
        """Column name → the value the UPDATE binds at `now` (`now` resolved); empty for a DELETE."""
        return _values(self.values, now)

    def statement(self, conn: Connection, ids: list[Any], now: datetime) -> Update | Delete:
        batch = any_of(conn, self.id_column, ids, self.id_column.type)
        if self.deletes:
            return delete(self.table).where(batch, self.where(now)).returning(self.id_column)
        return (update(self.table).where(batch, self.where(now)).values(self.set_values(now))
                .returning(self.id_column))

    def __call__(self, conn: Connection, ids: list[Any], now: datetime) -> set[str]:
        if not ids:
            return set()
        return {str(i) for i in conn.execute(self.statement(conn, ids, now)).scalars()}


def update_rows(table: Table, id_column: Column[Any], due_column: Column[Any],
                eligible: ColumnElement[bool], values: Mapping[Column[Any], Any]) -> RowsEffect:
    """UPDATE … SET values WHERE id in the batch AND eligible AND due <= now RETURNING id."""
    return RowsEffect(table, id_column, due_column, eligible, values)


def delete_rows(table: Table, id_column: Column[Any], due_column: Column[Any],
                eligible: ColumnElement[bool]) -> RowsEffect:
    """DELETE … WHERE id in the batch AND eligible AND due <= now RETURNING id."""
    return RowsEffect(table, id_column, due_column, eligible, deletes=True)


@dataclass(frozen=True, eq=False)
class ReadTargets:
    """The rows of the batch still eligible and due, as subject id → column → value: what an
    external call is made from (URL placeholders, the object key)."""

    table: Table
    id_column: Column[Any]
    due_column: Column[Any]
    eligible: ColumnElement[bool]

    def where(self, now: datetime) -> ColumnElement[bool]:
        """The condition a row must meet at `now` to be called for, the batch's ids aside."""
        return due_rows(self.eligible, self.due_column, now)

    def __call__(self, conn: Connection, ids: list[Any], now: datetime) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        stmt = select(self.table).where(any_of(conn, self.id_column, ids, self.id_column.type), self.where(now))
        rows = conn.execute(stmt).mappings()
        return {str(row[self.id_column.name]): {c.name: row[c.name] for c in self.table.columns} for row in rows}


def read_targets(table: Table, id_column: Column[Any], due_column: Column[Any],
                 eligible: ColumnElement[bool]) -> ReadTargets:
    """The targets statement of an external effect (`ReadTargets`)."""
    return ReadTargets(table, id_column, due_column, eligible)


@dataclass(frozen=True, eq=False)
class MarkDone:
    """After the external effect succeeded: set `values` (then_set) on the rows still eligible and
    return their ids; with nothing to set, every given id is done."""

    table: Table
    id_column: Column[Any]
    eligible: ColumnElement[bool]
    values: Mapping[Column[Any], Any]

    def set_values(self, now: datetime) -> dict[str, Any]:
        """Column name → the value then_set binds at `now` (`now` resolved)."""
        return _values(self.values, now)

    def __call__(self, conn: Connection, ids: list[Any], now: datetime) -> set[str]:
        if not self.values:
            return {str(i) for i in ids}
        if not ids:
            return set()
        stmt = (update(self.table)
                .where(any_of(conn, self.id_column, ids, self.id_column.type), self.eligible)
                .values(self.set_values(now))
                .returning(self.id_column))
        return {str(i) for i in conn.execute(stmt).scalars()}


def mark_done(table: Table, id_column: Column[Any], eligible: ColumnElement[bool],
              values: Mapping[Column[Any], Any]) -> MarkDone:
    """The completion statement of an external effect (`MarkDone`)."""
    return MarkDone(table, id_column, eligible, values)
