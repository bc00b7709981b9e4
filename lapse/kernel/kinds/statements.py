"""The statements of declared effects, built by SQLAlchemy over the reflected table.

Every statement is conditional: it touches only the batch's ids whose rows still satisfy the
kind's eligibility (and, for the effect itself, are due), so a payment or cancellation that won
the race leaves its row alone, and a second delivery changes nothing. Each returns the subject ids
it changed, as strings (the event's subject ids).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, Table, delete, select, update

from lapse.kernel.batch_sql import any_of
from lapse.kernel.kinds.columns import NOW, now_for

Effect = Callable[[Connection, list[Any], datetime], set[str]]
Targets = Callable[[Connection, list[Any], datetime], dict[str, dict[str, Any]]]


def _values(values: Mapping[Column[Any], Any], now: datetime) -> dict[str, Any]:
    return {column.name: now_for(column, now) if value is NOW else value for column, value in values.items()}


def update_rows(table: Table, id_column: Column[Any], due_column: Column[Any],
                eligible: ColumnElement[bool], values: Mapping[Column[Any], Any]) -> Effect:
    """UPDATE … SET values WHERE id in the batch AND eligible AND due <= now RETURNING id."""

    def apply(conn: Connection, ids: list[Any], now: datetime) -> set[str]:
        if not ids:
            return set()
        stmt = (update(table)
                .where(any_of(conn, id_column, ids, id_column.type), eligible, due_column <= now)
                .values(_values(values, now))
                .returning(id_column))
        return {str(i) for i in conn.execute(stmt).scalars()}

    return apply


def delete_rows(table: Table, id_column: Column[Any], due_column: Column[Any],
                eligible: ColumnElement[bool]) -> Effect:
    """DELETE … WHERE id in the batch AND eligible AND due <= now RETURNING id."""

    def apply(conn: Connection, ids: list[Any], now: datetime) -> set[str]:
        if not ids:
            return set()
        stmt = (delete(table)
                .where(any_of(conn, id_column, ids, id_column.type), eligible, due_column <= now)
                .returning(id_column))
        return {str(i) for i in conn.execute(stmt).scalars()}

    return apply


def read_targets(table: Table, id_column: Column[Any], due_column: Column[Any],
                 eligible: ColumnElement[bool]) -> Targets:
    """The rows of the batch still eligible and due, as subject id → column → value: what an
    external call is made from (URL placeholders, the object key)."""

    def targets(conn: Connection, ids: list[Any], now: datetime) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        stmt = select(table).where(any_of(conn, id_column, ids, id_column.type), eligible, due_column <= now)
        rows = conn.execute(stmt).mappings()
        return {str(row[id_column.name]): {c.name: row[c.name] for c in table.columns} for row in rows}

    return targets


def mark_done(table: Table, id_column: Column[Any], eligible: ColumnElement[bool],
              values: Mapping[Column[Any], Any]) -> Effect:
    """After the external effect succeeded: set `values` (then_set) on the rows still eligible and
    return their ids; with nothing to set, every given id is done."""

    def complete(conn: Connection, ids: list[Any], now: datetime) -> set[str]:
        if not values:
            return {str(i) for i in ids}
        if not ids:
            return set()
        stmt = (update(table)
                .where(any_of(conn, id_column, ids, id_column.type), eligible)
                .values(_values(values, now))
                .returning(id_column))
        return {str(i) for i in conn.execute(stmt).scalars()}

    return complete
