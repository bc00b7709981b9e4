"""The statements of declared effects, built by SQLAlchemy over the reflected table.

Every statement is conditional: it touches only the batch's ids whose rows still satisfy the
kind's eligibility (and, for the effect itself, are due: `due_rows`), so a payment or
cancellation that won the race leaves its row alone, and a second delivery changes nothing. For a
kind with a generation each subject of the batch is (id, generation) and a row is touched only while
it is still of that generation (`batch_rows`): a late delivery of an earlier lapse leaves the next
one alone. Each returns the subjects it changed as the op keys name them (`subject_key`). The
effects are objects rather than closures so that `lapse kinds plan` reads the very clause and
values they run with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    BindParameter,
    Column,
    ColumnElement,
    Connection,
    Delete,
    Table,
    Update,
    and_,
    any_,
    bindparam,
    case,
    delete,
    false,
    literal_column,
    select,
    true,
    update,
)

from lapse.kernel.batch_sql import any_of, any_of_bound, array_of, batch_values, pairs_of
from lapse.kernel.kinds.columns import NOW, now_for
from lapse.kernel.kinds.generations import Generation


def due_rows(eligible: ColumnElement[bool], due_column: Column[Any], now: datetime | BindParameter[Any]
             ) -> ColumnElement[bool]:
    """The rows an effect may change at `now` (or at the `now` bound at execution): still eligible
    and due. The one clause the effects' statements, the sweep's pages and the preview share."""
    return and_(eligible, due_column <= now)


def on_each_row(condition: ColumnElement[bool]) -> ColumnElement[bool]:
    """`condition` checked on each row the batch's ids found, never used to choose how to find
    them. As a plain condition (`status = 'held' AND expires_at <= now`) it matches the sweep's
    partial index, and while the table's statistics still count none of its newest rows the
    planner reads the batch along that index, through every due row (500 rows: 280 ms instead of
    2: docs/performance.md); as a CASE it proves nothing and the ids' own index is the one way in."""
    return case((condition, true()), else_=false())


def batch_rows(conn: Connection, id_column: Column[Any], generation: Generation | None,
               subjects: list[Any]) -> ColumnElement[bool]:
    """The batch's rows: those whose id is among `subjects`; for a kind with a generation, whose
    (id, generation) is (on PostgreSQL the pairs drive one lookup of the id's index each: an extra
    `id IN (…)` beside them was planned as a nested loop over the batch, quadratic in its size)."""
    if generation is None:
        return any_of(conn, id_column, subjects, id_column.type)
    return pairs_of(conn, (id_column, generation.column), subjects)


def subject_key(subject: Any, generation: Generation | None) -> str:
    """A parsed subject (or a row's id and generation) as the op key names it."""
    return str(subject) if generation is None else generation.key(*subject)


def _keys(rows: Any, generation: Generation | None) -> set[str]:
    return {subject_key(row[0] if generation is None else (row[0], row[1]), generation) for row in rows}


def _returning(id_column: Column[Any], generation: Generation | None) -> tuple[Column[Any], ...]:
    return (id_column,) if generation is None else (id_column, generation.column)


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
    generation: Generation | None = None
    # Per dialect (`__call__`), and as `fused_effect` made it.
    built: dict[str, Any] = field(default_factory=dict, repr=False)

    def where(self, now: datetime) -> ColumnElement[bool]:
        """The effect's condition on a row at `now`, the batch's ids aside."""
        return due_rows(self.eligible, self.due_column, now)

    def set_values(self, now: datetime) -> dict[str, Any]:
        """Column name → the value the UPDATE binds at `now` (`now` resolved); empty for a DELETE."""
        return _values(self.values, now)

    def statement(self, conn: Connection, ids: list[Any], now: datetime) -> Update | Delete:
        batch = batch_rows(conn, self.id_column, self.generation, ids)
        returning = _returning(self.id_column, self.generation)
        if self.deletes:
            return delete(self.table).where(batch, on_each_row(self.where(now))).returning(*returning)
        return (update(self.table).where(batch, on_each_row(self.where(now))).values(self.set_values(now))
                .returning(*returning))

    def __call__(self, conn: Connection, ids: list[Any], now: datetime) -> set[str]:
        if not ids:
            return set()
        if self.generation is not None:
            return _keys(conn.execute(self.statement(conn, ids, now)), self.generation)
        stmt = self.built.get(conn.dialect.name)
        if stmt is None:  # built once, its values bound at execution: compiled once, not once a batch
            due = due_rows(self.eligible, self.due_column, bindparam("lapse_now", type_=self.due_column.type))
            where = and_(any_of_bound(conn, self.id_column, "lapse_ids", self.id_column.type), on_each_row(due))
            stmt = delete(self.table) if self.deletes else update(self.table).values(
                {column.name: bindparam(f"lapse_set_{column.name}", type_=column.type) for column in self.values})
            stmt = self.built[conn.dialect.name] = stmt.where(where).returning(self.id_column)
        params = {"lapse_ids": batch_values(conn, ids), "lapse_now": now,
                  **{f"lapse_set_{name}": value for name, value in self.set_values(now).items()}}
        return _keys(conn.execute(stmt, params).all(), None)


class FusedEffect(NamedTuple):
    """A declared effect as a part of one larger statement (`ledger.settle_and_apply`): `sql`, an
    UPDATE or DELETE of the rows whose ids are `ARRAY(SELECT subject FROM lapse_settled)` (still
    eligible and due at `lapse_now`) returning each changed id; `subject_type`, the array type of
    those ids; `constants`, the parameters its conditions carry; `convert`, what SQLAlchemy would
    do to a parameter's value before sending it (by name); `effect`, what it was made of."""

    sql: str
    subject_type: str
    constants: Mapping[str, Any]
    convert: Mapping[str, Callable[[Any], Any]]
    effect: RowsEffect

    def params(self, now: datetime) -> dict[str, Any]:
        """Its parameters at `now`, converted as SQLAlchemy would convert them."""
        values = {"lapse_now": now,
                  **{f"lapse_set_{name}": value for name, value in self.effect.set_values(now).items()}}
        convert = self.convert
        return {**self.constants, **{name: convert[name](value) if name in convert else value
                                     for name, value in values.items()}}


def fused_effect(effect: RowsEffect, conn: Connection) -> FusedEffect | None:
    """`effect` as a `FusedEffect` on PostgreSQL, built and compiled once; None where it cannot be
    one (another database, a generation, a parameter SQLAlchemy would expand into several), and
    the effect then runs as a statement of its own."""
    if effect.generation is not None or conn.dialect.name != "postgresql":
        return None
    if "fused" in effect.built:
        return effect.built["fused"]  # type: ignore[no-any-return]
    due = due_rows(effect.eligible, effect.due_column, bindparam("lapse_now", type_=effect.due_column.type))
    ids = effect.id_column == any_(literal_column("ARRAY(SELECT subject FROM lapse_settled)"))
    stmt = delete(effect.table) if effect.deletes else update(effect.table).values(
        {column.name: bindparam(f"lapse_set_{column.name}", type_=column.type) for column in effect.values})
    compiled = stmt.where(ids, on_each_row(due)).returning(effect.id_column).compile(dialect=conn.dialect)
    convert = {compiled.bind_names[bind]: process for bind in compiled.binds.values()
               if (process := bind.type.bind_processor(conn.dialect)) is not None}
    fused = None
    if not any(bind.expanding for bind in compiled.binds.values()) and "POSTCOMPILE" not in compiled.string:
        constants = {name: convert[name](value) if name in convert else value
                     for name, value in compiled.params.items()
                     if name != "lapse_now" and not name.startswith("lapse_set_")}
        fused = FusedEffect(compiled.string, str(array_of(effect.id_column.type).compile(dialect=conn.dialect)),
                            constants, convert, effect)
    effect.built["fused"] = fused
    return fused


def update_rows(table: Table, id_column: Column[Any], due_column: Column[Any],
                eligible: ColumnElement[bool], values: Mapping[Column[Any], Any],
                generation: Generation | None = None) -> RowsEffect:
    """UPDATE … SET values WHERE (id[, generation]) in the batch AND eligible AND due <= now RETURNING id."""
    return RowsEffect(table, id_column, due_column, eligible, values, generation=generation)


def delete_rows(table: Table, id_column: Column[Any], due_column: Column[Any],
                eligible: ColumnElement[bool], generation: Generation | None = None) -> RowsEffect:
    """DELETE … WHERE (id[, generation]) in the batch AND eligible AND due <= now RETURNING id."""
    return RowsEffect(table, id_column, due_column, eligible, deletes=True, generation=generation)


@dataclass(frozen=True, eq=False)
class ReadTargets:
    """The rows of the batch still eligible and due (and of their generation), as subject key →
    column → value: what an external call is made from (URL placeholders, the object key)."""

    table: Table
    id_column: Column[Any]
    due_column: Column[Any]
    eligible: ColumnElement[bool]
    generation: Generation | None = None

    def where(self, now: datetime) -> ColumnElement[bool]:
        """The condition a row must meet at `now` to be called for, the batch's ids aside."""
        return due_rows(self.eligible, self.due_column, now)

    def __call__(self, conn: Connection, ids: list[Any], now: datetime) -> dict[str, dict[str, Any]]:
        if not ids:
            return {}
        stmt = select(self.table).where(batch_rows(conn, self.id_column, self.generation, ids),
                                        on_each_row(self.where(now)))
        gen = self.generation
        return {subject_key(row[self.id_column.name] if gen is None else (row[self.id_column.name], row[gen.name]),
                            gen): {c.name: row[c.name] for c in self.table.columns}
                for row in conn.execute(stmt).mappings()}


def read_targets(table: Table, id_column: Column[Any], due_column: Column[Any],
                 eligible: ColumnElement[bool], generation: Generation | None = None) -> ReadTargets:
    """The targets statement of an external effect (`ReadTargets`)."""
    return ReadTargets(table, id_column, due_column, eligible, generation)


@dataclass(frozen=True, eq=False)
class MarkDone:
    """After the external effect succeeded: set `values` (then_set) on the rows still eligible (and
    of their generation) and return their subject keys; with nothing to set, every given one is done."""

    table: Table
    id_column: Column[Any]
    eligible: ColumnElement[bool]
    values: Mapping[Column[Any], Any]
    generation: Generation | None = None

    def set_values(self, now: datetime) -> dict[str, Any]:
        """Column name → the value then_set binds at `now` (`now` resolved)."""
        return _values(self.values, now)

    def __call__(self, conn: Connection, ids: list[Any], now: datetime) -> set[str]:
        if not self.values:
            return {subject_key(i, self.generation) for i in ids}
        if not ids:
            return set()
        stmt = (update(self.table)
                .where(batch_rows(conn, self.id_column, self.generation, ids), on_each_row(self.eligible))
                .values(self.set_values(now))
                .returning(*_returning(self.id_column, self.generation)))
        return _keys(conn.execute(stmt), self.generation)


def mark_done(table: Table, id_column: Column[Any], eligible: ColumnElement[bool],
              values: Mapping[Column[Any], Any], generation: Generation | None = None) -> MarkDone:
    """The completion statement of an external effect (`MarkDone`)."""
    return MarkDone(table, id_column, eligible, values, generation)
