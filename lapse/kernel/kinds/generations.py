"""A kind's generation: the column that tells one lapse of a business row from the next.

A reservation held, released and held again lapses twice; a kind that declares `generation:
hold_started_at` names each lapse apart (`release-reservation:42@<generation>`), so each is its
own operation, applied once. The generation's value is written in one canonical text, by Python
(`text`, for a value read or given) and by SQL (`sql_text`, for the business row's column inside
the ledger probes), the same on both sides:

- a timestamp with time zone: `YYYYMMDDTHHMMSS.ffffffZ` in UTC, always 23 characters;
- an integer (a version number): its decimal digits, `-` before a negative one.

Why this form, and what it costs: docs/design/generations.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, ColumnElement, Integer, String, Table, cast, func, literal, type_coerce

from lapse.kernel.kinds.columns import column_of, has_timezone, int_range, is_timestamp, qualified, reflected_type
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.ledger import GENERATION_MARK

_TIMESTAMP = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})\.(\d{6})Z")  # whole text: fullmatch
_INTEGER = re.compile(r"-?[1-9][0-9]*|0")
TIMESTAMP_FORMAT = "YYYYMMDDTHHMMSS.ffffffZ"


def timestamp_text(value: datetime) -> str:
    """An aware timestamp as a generation: UTC, to the microsecond (ValueError for a naive one)."""
    if value.tzinfo is None:
        raise ValueError("a timestamp generation is timezone-aware")
    t = value.astimezone(UTC)
    return (f"{t.year:04d}{t.month:02d}{t.day:02d}T{t.hour:02d}{t.minute:02d}{t.second:02d}"
            f".{t.microsecond:06d}Z")


def generation_text(value: Any) -> str:
    """A generation given by application code as the op key carries it: an aware datetime or an
    int; ValueError for anything else (the kind's own `Generation.text` also checks the column)."""
    if isinstance(value, datetime):
        return timestamp_text(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"a generation is an aware datetime or an int, not {type(value).__name__}")


@dataclass(frozen=True)
class Generation:
    """The generation column of a kind, with the canonical text of its values."""

    column: Column[Any]
    dialect: str
    timestamp: bool
    low: int = 0  # an integer column's range
    high: int = 0

    @property
    def name(self) -> str:
        return self.column.name

    def text(self, value: Any) -> str:
        """The canonical text of a value of the column; ValueError when it cannot be one."""
        if self.timestamp:
            if not isinstance(value, datetime):
                raise ValueError(f"generation {self.name} is a timestamp, not {type(value).__name__}")
            return timestamp_text(value)
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise ValueError(f"generation {self.name} is an integer from {self.low} to {self.high}, "
                             f"not {str(value)[:40]!r}")
        return str(value)

    def parse(self, text: str) -> Any:
        """The column's value of a canonical text (ValueError for any other text: one op key per lapse)."""
        if self.timestamp:
            match = _TIMESTAMP.fullmatch(text)
            try:
                if match is None:
                    raise ValueError
                year, month, day, hour, minute, second, micro = (int(part) for part in match.groups())
                return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)
            except ValueError:
                raise ValueError(f"generation {text[:40]!r} is not a time of {self.name} "
                                 f"({TIMESTAMP_FORMAT}, UTC)") from None
        if not _INTEGER.fullmatch(text) or not self.low <= int(text) <= self.high:
            raise ValueError(f"generation {text[:40]!r} is not a version of {self.name} "
                             f"(an integer from {self.low} to {self.high})")
        return int(text)

    def key(self, subject: Any, value: Any) -> str:
        """The subject as the op key names it: `<subject_id>@<generation>`."""
        return f"{subject}{GENERATION_MARK}{self.text(value)}"

    def sql_text(self, expr: ColumnElement[Any]) -> ColumnElement[str]:
        """`text` in SQL, over `expr` (the column, or the column of a subquery of the table)."""
        if not self.timestamp:
            return cast(expr, String)
        if self.dialect == "postgresql":
            return func.to_char(func.timezone("UTC", expr), 'YYYYMMDD"T"HH24MISS.US"Z"')
        # SQLite keeps a timestamp as text, `YYYY-MM-DD HH:MM:SS[.ffffff]` in UTC (SQLAlchemy's form).
        raw = type_coerce(expr, String)

        def part(source: ColumnElement[str], start: int, length: int) -> ColumnElement[str]:
            return func.substr(source, start, length, type_=String)

        text: ColumnElement[str] = part(raw, 1, 4)
        for piece in (part(raw, 6, 2), part(raw, 9, 2), literal("T"), part(raw, 12, 2), part(raw, 15, 2),
                      part(raw, 18, 2), literal("."), part(raw + ".000000", 21, 6), literal("Z")):
            text = text + piece
        return text


def generation_of(table: Table, name: str, taken: set[str], dialect: str) -> Generation:
    """The kind's generation column, checked: NOT NULL, a timestamp with time zone or an integer,
    and neither the id nor the due column (`taken`); KindError at `generation` otherwise."""
    column = column_of(table, name, "generation")
    if column.name in taken:
        raise KindError("generation", f"column {show(column.name)} is the kind's id or due column; a generation "
                                      "is a column set anew each time the subject starts over (hold_started_at)")
    if column.nullable:
        raise KindError("generation", f"column {show(column.name)} of {qualified(table)} is nullable; "
                                      "a generation column is NOT NULL")
    if is_timestamp(column):
        if not has_timezone(column, dialect):
            raise KindError("generation", f"column {show(column.name)} is a timestamp without time zone; "
                                          "a generation is a timestamp with time zone or an integer column")
        return Generation(column, dialect, timestamp=True)
    if not isinstance(reflected_type(column), Integer):
        raise KindError("generation", f"column {show(column.name)} has type {reflected_type(column)}; "
                                      "a generation is a timestamp with time zone or an integer column")
    low, high = int_range(column, dialect)
    return Generation(column, dialect, timestamp=False, low=low, high=high)

