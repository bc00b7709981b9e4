"""The business table as the database has it: reflected, its columns looked up by exact name, and
every value from the kinds file checked against (and converted for) the column it is bound to.

Nothing from the file becomes SQL text: a name must be a column of the reflected table (a name
with a quote or a semicolon simply is not one), and a value is a bound parameter of the column's
own type, refused here when it cannot fit (a string for an integer, a string longer than the
column, `now` for a column that is not a timestamp).
"""

from __future__ import annotations

import re
import uuid
import warnings
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Date,
    DateTime,
    Engine,
    Enum,
    Float,
    Integer,
    MetaData,
    Numeric,
    SmallInteger,
    String,
    Table,
    Uuid,
)
from sqlalchemy.engine import Inspector
from sqlalchemy.exc import DBAPIError, NoSuchTableError, SAWarning
from sqlalchemy.types import BigInteger, TypeEngine

from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.models import UTCDateTime

Bind = Engine | Connection
REFLECTED_TYPE = "lapse_reflected_type"  # Column.info key: the type as reflected, before UTCDateTime
NOW_WORD = "now"


class _Now:
    """The marker of a value that is the statement's `now` (the word `now` in the file, for a
    timestamp column); a text column given `now` gets the string."""

    def __repr__(self) -> str:
        return "now"


NOW = _Now()
_SUBJECT = re.compile(r"^[A-Za-z0-9._/-]{1,128}$")  # what an op key's subject may hold
_INT_TEXT = re.compile(r"^-?[1-9][0-9]*$|^0$")


def qualified(table: Table) -> str:
    return f"{table.schema}.{table.name}" if table.schema else table.name


def split_table_name(name: str) -> tuple[str | None, str]:
    """`shop.orders` → ("shop", "orders"); `orders` → (None, "orders")."""
    schema, dot, table = name.rpartition(".")
    if dot and (not schema or not table or "." in schema):
        raise KindError("table", f"expected name or schema.name, not {show(name)}")
    return (schema or None), table


def reflect(bind: Bind, metadata: MetaData, name: str) -> Table:
    """The table `name` (`schema.table`, or bare for the default schema) as the database has it;
    timestamp columns read back timezone-aware (UTC), whatever the dialect stores."""
    schema, table_name = split_table_name(name)
    if "\0" in name or len(table_name) > 128:
        raise KindError("table", f"no table {show(name)}")
    dialect = bind.dialect.name

    def on_column(inspector: Inspector, table: Table, info: Any) -> None:
        reflected = info["type"]
        if isinstance(reflected, DateTime) and (dialect == "sqlite" or reflected.timezone):
            info["info"] = {**(info.get("info") or {}), REFLECTED_TYPE: reflected}
            info["type"] = UTCDateTime()

    try:
        with warnings.catch_warnings():  # a type SQLAlchemy does not know is refused where it is used
            warnings.filterwarnings("ignore", "Did not recognize type", SAWarning)
            return Table(table_name, metadata, schema=schema, autoload_with=bind, resolve_fks=False,
                         listeners=[("column_reflect", on_column)])
    except NoSuchTableError:
        raise KindError("table", f"no table {show(name)}") from None
    except DBAPIError as exc:
        raise KindError("table", f"cannot read table {show(name)}: {str(exc.orig).splitlines()[0]}") from None


def reflected_type(column: Column[Any]) -> TypeEngine[Any]:
    found: TypeEngine[Any] = column.info.get(REFLECTED_TYPE, column.type)
    return found


def column_of(table: Table, name: Any, field: str) -> Column[Any]:
    """The column named exactly `name`; KindError at `field` when the table has none."""
    column = table.c.get(name) if isinstance(name, str) else None
    if column is None:
        raise KindError(field, f"no column {show(name)} in {qualified(table)}")
    return column


def is_timestamp(column: Column[Any]) -> bool:
    return isinstance(reflected_type(column), DateTime)


def has_timezone(column: Column[Any], dialect: str) -> bool:
    """A timestamp that names an instant: `timestamp with time zone` (SQLite stores UTC always)."""
    kind = reflected_type(column)
    return isinstance(kind, DateTime) and (dialect == "sqlite" or bool(kind.timezone))


def int_range(column: Column[Any], dialect: str) -> tuple[int, int]:
    kind = reflected_type(column)
    bits = 16 if isinstance(kind, SmallInteger) else 64 if (
        isinstance(kind, BigInteger) or dialect == "sqlite") else 32
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def fit(column: Column[Any], value: Any, field: str, dialect: str) -> Any:
    """`value` as a bound parameter of `column`: checked against its type and converted where the
    driver needs it (a UUID object, a date). Timestamps take no literal values here."""
    kind = reflected_type(column)
    name = show(column.name)

    def wrong(expected: str) -> KindError:
        return KindError(field, f"{show(value)} does not fit column {name} ({kind}): expected {expected}")

    if value is None:
        return None
    if isinstance(kind, Boolean):
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if isinstance(kind, Integer):
        low, high = int_range(column, dialect)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise wrong(f"an integer from {low} to {high}")
        return value
    if isinstance(kind, (Numeric, Float)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
        return value
    if isinstance(kind, Enum):
        if not isinstance(value, str) or value not in kind.enums:
            raise wrong("one of " + ", ".join(show(e) for e in kind.enums[:20]))
        return value
    if isinstance(kind, String):
        if not isinstance(value, str) or "\0" in value:
            raise wrong("a string (quote yes/no/on/off and numbers meant as text)")
        if kind.length is not None and len(value) > kind.length:
            raise wrong(f"a string of at most {kind.length} characters")
        return value
    if isinstance(kind, Uuid):
        try:
            parsed = uuid.UUID(value) if isinstance(value, str) else None
        except ValueError:
            parsed = None
        if parsed is None:
            raise wrong("a UUID")
        return parsed if kind.as_uuid else str(parsed)
    if isinstance(kind, DateTime):
        raise KindError(field, f"timestamp column {name} takes only null or {{not: null}} here")
    if isinstance(kind, Date):
        if isinstance(value, datetime) or not isinstance(value, (date, str)):
            raise wrong("a date (YYYY-MM-DD)")
        try:
            return value if isinstance(value, date) else date.fromisoformat(value)
        except ValueError:
            raise wrong("a date (YYYY-MM-DD)") from None
    raise KindError(field, f"column {name} has type {kind}, which declarations cannot compare; "
                           "write a python kind")


def settable(column: Column[Any], value: Any, field: str, dialect: str) -> Any:
    """A value an effect sets: as `fit`, plus `now` for a timestamp column and no null for a NOT
    NULL column. `now` comes back as the NOW marker, resolved when the statement runs."""
    if is_timestamp(column):
        if value == NOW_WORD:
            return NOW
        if value is not None:
            raise KindError(field, f"timestamp column {show(column.name)} takes `now` or null")
    if value is None and not column.nullable:
        raise KindError(field, f"column {show(column.name)} is NOT NULL")
    if value == NOW_WORD and not isinstance(reflected_type(column), String):
        raise KindError(field, f"`now` is only for timestamp columns, and {show(column.name)} is not one")
    return fit(column, value, field, dialect)


def now_for(column: Column[Any], now: datetime) -> datetime:
    """`now` as the column stores it: an aware instant, or UTC wall time for a naive timestamp."""
    return now if column.info.get(REFLECTED_TYPE) is not None else now.astimezone(UTC).replace(tzinfo=None)


def subject_parser(column: Column[Any], dialect: str) -> Callable[[str], Any]:
    """A function that turns an event's subject id into the id column's value, refusing (with
    ValueError) an id that cannot be one: out of range, not canonical (so the op key is the
    same whichever way it was written), too long, or not an op key's subject."""
    kind = reflected_type(column)
    if isinstance(kind, Integer):
        low, high = int_range(column, dialect)

        def parse_int(subject_id: str) -> int:
            if not _INT_TEXT.match(subject_id) or not low <= int(subject_id) <= high:
                raise ValueError(f"subject id {subject_id[:40]!r} is not a numeric id ({low} to {high})")
            return int(subject_id)

        return parse_int
    if isinstance(kind, Uuid):
        as_uuid = kind.as_uuid

        def parse_uuid(subject_id: str) -> Any:
            try:
                parsed = uuid.UUID(subject_id)
            except ValueError:
                parsed = None
            if parsed is None or str(parsed) != subject_id:
                raise ValueError(f"subject id {subject_id[:40]!r} is not a UUID (lowercase, with dashes)")
            return parsed if as_uuid else subject_id

        return parse_uuid
    length = kind.length if isinstance(kind, String) else None

    def parse_text(subject_id: str) -> str:
        if not _SUBJECT.match(subject_id) or (length is not None and len(subject_id) > length):
            raise ValueError(f"subject id {subject_id[:40]!r} is not an id of {column.name} "
                             f"(letters, digits, . _ / -, at most {min(length or 128, 128)})")
        return subject_id

    return parse_text


def check_id_column(column: Column[Any]) -> None:
    if not isinstance(reflected_type(column), (Integer, String, Uuid)):
        raise KindError("id", f"column {show(column.name)} has type {reflected_type(column)}; "
                              "an id is an integer, text or uuid column")
