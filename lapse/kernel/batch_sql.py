"""Batch-shaped SQL whose text does not depend on the batch size.

On PostgreSQL a batch travels as one string parameter: `col = ANY(CAST(:literal AS type[]))`
instead of an `IN` list of placeholders, and `INSERT … SELECT … FROM
json_populate_recordset(…, :rows)` instead of multi-row VALUES. The statement text is then the
same for every batch, so psycopg converts it once and the server prepares it once; per-placeholder
parsing and per-element array escaping were most of a batch's cost. Inserts into several tables
go as one statement of data-modifying CTEs (`bulk_insert_together`), one round trip for all of them.
The hottest statements skip SQLAlchemy altogether (`run_prepared`: typed arrays, sent binary, to a
statement the server prepared once). SQLite keeps the portable forms.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from typing import Any

import psycopg
from sqlalchemy import (
    ColumnElement,
    Connection,
    Enum,
    Float,
    Numeric,
    Row,
    String,
    Table,
    Text,
    any_,
    bindparam,
    cast,
    func,
    insert,
    select,
    text,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import TypeEngine

from lapse.kernel.database import qualified_name

_TEMPLATES: dict[tuple[str, tuple[str, ...], bool, tuple[str, ...]], str] = {}


def _array_literal(values: Sequence[Any]) -> str:
    """A PostgreSQL array literal, built in one pass: `{1,2}` or `{"a","b"}`."""
    if all(isinstance(v, int) for v in values):
        return "{" + ",".join(map(str, values)) + "}"
    quoted = (str(v).replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return '{"' + '","'.join(quoted) + '"}'


def _unbounded(type_: TypeEngine[Any]) -> TypeEngine[Any]:
    """`type_` without the length or precision a cast would shorten or round a value to (CAST AS
    VARCHAR(4)[] makes 'abcdX' the 'abcd' of another row): text for a string, numeric for a decimal."""
    if isinstance(type_, String) and not isinstance(type_, Enum):
        return Text()
    if isinstance(type_, Numeric) and not isinstance(type_, Float):
        return Numeric()
    return type_


def array_of(element_type: TypeEngine[Any]) -> postgresql.ARRAY[Any]:
    """The PostgreSQL array type a batch of `element_type` values is cast to (`_unbounded`)."""
    return postgresql.ARRAY(_unbounded(element_type))


def any_of(conn: Connection, column: ColumnElement[Any], values: Sequence[Any],
           element_type: TypeEngine[Any] | None = None) -> ColumnElement[bool]:
    """`column = ANY(CAST(:literal AS type[]))` on PostgreSQL, `column IN (…)` elsewhere. Planned
    with the batch's own array (the engine's `plan_cache_mode`, `lapse.kernel.database`), the
    array is a constant whose length the planner knows, and testing each row of a scan against
    hundreds of elements costs it far more than as many index probes: an index plan at any table
    size. (`IN (SELECT unnest(…))` became a hash join over a sequential scan of the whole table
    once the table held a few thousand rows: PITFALLS.md.) The cast is to the column's type
    without its length or precision, so no value is shortened or rounded into another one."""
    if conn.dialect.name == "postgresql":
        array = array_of(element_type if element_type is not None else column.type)
        literal = bindparam(None, _array_literal(values), type_=Text)
        return column == any_(cast(literal, array))
    return column.in_(list(values))


def any_of_bound(conn: Connection, column: ColumnElement[Any], name: str,
                 element_type: TypeEngine[Any] | None = None) -> ColumnElement[bool]:
    """`any_of` with the batch's values bound at execution as `name` (`batch_values`), for a
    statement built and compiled once and run for every batch."""
    if conn.dialect.name == "postgresql":
        array = array_of(element_type if element_type is not None else column.type)
        return column == any_(cast(bindparam(name, type_=Text), array))
    return column.in_(bindparam(name, expanding=True))


def batch_values(conn: Connection, values: Sequence[Any]) -> Any:
    """`values` as an `any_of_bound` parameter takes them."""
    return _array_literal(values) if conn.dialect.name == "postgresql" else list(values)


def run_prepared(conn: Connection, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """Run `sql` (PostgreSQL, psycopg's `%(name)s` placeholders) in `conn`'s transaction on its
    psycopg connection, past SQLAlchemy: prepared by the server on first use, every parameter sent
    in binary (a Python list as a typed array), rows back as tuples. A failure is raised as
    SQLAlchemy raises it (`DBAPIError` and its kinds, parameters hidden; a lost connection
    invalidated), and the engine's `before_cursor_execute` listeners see the statement, as for any
    other."""
    driver = conn.connection.driver_connection
    cursor = driver.cursor()  # type: ignore[union-attr]
    for listener in conn.dispatch.before_cursor_execute:
        listener(conn, cursor, sql, params, None, False)
    try:
        cursor.execute(sql, params, prepare=True, binary=True)
        return cursor.fetchall() if cursor.description is not None else []
    except psycopg.Error as exc:
        invalidated = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, cursor)  # type: ignore[arg-type]
        if invalidated:
            conn.invalidate(exc)
        raise DBAPIError.instance(sql, params, exc, psycopg.Error, hide_parameters=True,
                                  connection_invalidated=invalidated, dialect=conn.dialect) from exc
    finally:
        cursor.close()


def pairs_of(conn: Connection, columns: tuple[ColumnElement[Any], ColumnElement[Any]],
             pairs: Sequence[tuple[Any, Any]]) -> ColumnElement[bool]:
    """`(a, b) IN (SELECT * FROM unnest(CAST(:a AS type[]), CAST(:b AS type[])))` on PostgreSQL (one
    array parameter per column, zipped), `(a, b) IN ((…), …)` elsewhere."""
    if conn.dialect.name == "postgresql":
        arrays = [cast(bindparam(None, _array_literal([pair[i] for pair in pairs]), type_=Text),
                       postgresql.ARRAY(column.type)) for i, column in enumerate(columns)]
        rows = func.unnest(*arrays).table_valued("a", "b").render_derived()
        return tuple_(*columns).in_(select(rows.c.a, rows.c.b))
    return tuple_(*columns).in_([tuple(pair) for pair in pairs])


def _to_json(rows: Any) -> str:
    """`rows` as JSON, dates and times as ISO 8601. A batch's rows share a few timestamps (the
    batch's `now` in every row), so each distinct one is formatted once per call."""
    formatted: dict[date, str] = {}

    def default(value: Any) -> str:
        if isinstance(value, (datetime, date)):
            text = formatted.get(value)
            if text is None:
                text = formatted[value] = value.isoformat()
            return text
        raise TypeError(f"cannot send {type(value).__name__} in a batch")

    return json.dumps(rows, default=default)


def _names(conn: Connection, cols: Sequence[str]) -> str:
    """Column names for SQL text, each quoted as the dialect needs (a name is never pasted as is)."""
    return ", ".join(conn.dialect.identifier_preparer.quote(col) for col in cols)


def _recordset_select(conn: Connection, name: str, cols: tuple[str, ...], param: str) -> str:
    """INSERT INTO `name` (cols) SELECT cols FROM the JSON array parameter `param` (its keys are the
    column names as they are, which json_populate_recordset matches to the row type's fields)."""
    names = _names(conn, cols)
    return (f"INSERT INTO {name} ({names}) SELECT {names} "
            f"FROM json_populate_recordset(NULL::{name}, CAST(:{param} AS json))")


def _recordset_insert_sql(conn: Connection, name: str, cols: tuple[str, ...], ignore_conflicts: bool,
                          returning: tuple[str, ...]) -> str:
    """The INSERT … SELECT … FROM json_populate_recordset text for the table called `name` (quoted
    and schema-qualified as the connection sees it: the table's row type has the same name)."""
    key = (name, cols, ignore_conflicts, returning)
    sql = _TEMPLATES.get(key)
    if sql is None:
        sql = _recordset_select(conn, name, cols, "rows")
        if ignore_conflicts:
            sql += " ON CONFLICT DO NOTHING"
        if returning:
            sql += f" RETURNING {_names(conn, returning)}"
        _TEMPLATES[key] = sql
    return sql


def bulk_insert_together(conn: Connection, batches: Sequence[tuple[Table, Sequence[dict[str, Any]]]]) -> None:
    """Insert several tables' rows (each table's rows all with the same keys) in one round trip on
    PostgreSQL: every insert but the last is a data-modifying CTE of the last, each table's rows one
    JSON parameter. Nothing joins, so the planner's row estimates cannot make it quadratic. Elsewhere
    (and for a single table) it is `bulk_insert` per table."""
    batches = [(table, rows) for table, rows in batches if rows]
    if conn.dialect.name != "postgresql" or len(batches) < 2:
        for table, rows in batches:
            bulk_insert(conn, table, rows)
        return
    names = [qualified_name(conn, table) for table, _ in batches]
    key = ("+".join(names), tuple(c for _, rows in batches for c in (*rows[0], "|")), False, ())
    sql = _TEMPLATES.get(key)
    if sql is None:
        parts = [_recordset_select(conn, name, tuple(rows[0]), f"rows{i}")
                 for i, (name, (_, rows)) in enumerate(zip(names, batches, strict=True))]
        ctes = ", ".join(f"w{i} AS ({part})" for i, part in enumerate(parts[:-1]))
        sql = _TEMPLATES[key] = f"WITH {ctes} {parts[-1]}"
    conn.execute(text(sql), {f"rows{i}": _to_json(rows)
                             for i, (_, rows) in enumerate(batches)})


def bulk_insert(conn: Connection, table: Table, rows: Sequence[dict[str, Any]], *, ignore_conflicts: bool = False,
                returning: Sequence[str] = ()) -> list[Row[Any]]:
    """Insert `rows` (all with the same keys) in one statement; with `ignore_conflicts`, rows that
    hit a unique key are dropped and only the inserted ones come back in `returning`.

    On PostgreSQL the whole batch is one JSON parameter expanded by `json_populate_recordset`
    (timestamps as ISO 8601 with their offset)."""
    if not rows:
        return []
    if conn.dialect.name != "postgresql":
        stmt = sqlite.insert(table).on_conflict_do_nothing() if ignore_conflicts else insert(table)
        if returning:
            return list(conn.execute(stmt.returning(*(table.c[r] for r in returning)), list(rows)).all())
        conn.execute(stmt, list(rows))
        return []
    sql = _recordset_insert_sql(conn, qualified_name(conn, table), tuple(rows[0]), ignore_conflicts,
                                tuple(returning))
    result = conn.execute(text(sql), {"rows": _to_json(rows)})
    return list(result.all()) if returning else []
