"""Batch-shaped SQL whose text does not depend on the batch size.

On PostgreSQL a batch travels as one string parameter: `col IN (SELECT unnest(CAST(:literal AS
type[])))` instead of an `IN` list of placeholders, and `INSERT … SELECT … FROM
json_populate_recordset(…, :rows)` instead of multi-row VALUES. The statement text is then the
same for every batch, so psycopg converts it once and the server prepares it once; per-placeholder
parsing and per-element array escaping were most of a batch's cost. Inserts into several tables
go as one statement of data-modifying CTEs (`bulk_insert_together`), one round trip for all of them.
SQLite keeps the portable forms.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

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
    bindparam,
    cast,
    func,
    insert,
    select,
    text,
    tuple_,
)
from sqlalchemy.dialects import postgresql, sqlite
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


def any_of(conn: Connection, column: ColumnElement[Any], values: Sequence[Any],
           element_type: TypeEngine[Any] | None = None) -> ColumnElement[bool]:
    """`column IN (SELECT unnest(CAST(:literal AS type[])))` on PostgreSQL, `column IN (…)`
    elsewhere. The subquery is evaluated once, even under a generic plan, and joins on the index;
    a bare `= ANY(CAST(…))` may be re-cast for every row scanned. The cast is to the column's type
    without its length or precision, so no value is shortened or rounded into another one."""
    if conn.dialect.name == "postgresql":
        array = postgresql.ARRAY(_unbounded(element_type if element_type is not None else column.type))
        literal = bindparam(None, _array_literal(values), type_=Text)
        return column.in_(select(func.unnest(cast(literal, array))).scalar_subquery())
    return column.in_(list(values))


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
