"""The archive's statements: the transitions table read as windows of writing transactions.

A transitions id is taken from a sequence when the row is inserted, but rows become visible when
their transaction commits, so ids appear out of order and "every id above the last one archived"
would miss a row committed late. Transaction ids do not have that problem: every transaction still
running, or yet to write, has an id at or above the oldest one running now,
`pg_snapshot_xmin(pg_current_snapshot())`. So the archive takes, in one REPEATABLE READ snapshot,
the rows whose writing transaction id lies in [the last window's end, that xmin): all of them are
committed and visible, and no later row can fall in that window. A row's `xmin` is the 32-bit id;
its 64-bit id is recovered against the snapshot's xmax (rows are far younger than 2^31
transactions). `at >= floor` keeps the read on the `at` index and its time partitions.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Connection, Text, bindparam, cast, literal_column, select, text

from lapse.kernel.clock import database_now
from lapse.kernel.models import ledger_transitions as T

_SNAPSHOT = text("SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint "
                 "FROM pg_current_snapshot() AS s")
_LOW32 = 4294967295
ROWS_PER_FETCH = 2000


@dataclass(frozen=True)
class Frontier:
    """One snapshot's bounds: every transaction id below `xmin` has ended; `xmax` the next id
    (the reference for 64-bit ids); `now` the database's time of the snapshot."""

    xmin: int
    xmax: int
    now: datetime


def frontier(conn: Connection) -> Frontier:
    """The bounds of the snapshot of `conn`'s transaction (REPEATABLE READ: its first statement's)."""
    xmin, xmax = conn.execute(_SNAPSHOT).one()
    return Frontier(int(xmin), int(xmax), database_now(conn))


def _xid() -> Any:
    """The writing transaction's 64-bit id of a transitions row, against the snapshot's xmax."""
    ref = bindparam("ref", type_=BigInteger)
    raw = cast(cast(literal_column("xmin"), Text), BigInteger)
    return (ref - (ref - raw).op("&")(_LOW32)).label("xid")


def window_rows(conn: Connection, first: int, bound: Frontier, floor: datetime | None) -> Iterator[dict[str, Any]]:
    """The transitions written by transactions with ids in [first, bound.xmin), by id; read in
    chunks from the server, never the whole window in memory."""
    inner = select(*T.c, _xid())
    if floor is not None:
        inner = inner.where(T.c.at >= floor)
    rows = inner.subquery()
    stmt = (select(rows).where(rows.c.xid >= first, rows.c.xid < bound.xmin).order_by(rows.c.id)
            .execution_options(yield_per=ROWS_PER_FETCH))
    for row in conn.execute(stmt, {"ref": bound.xmax}):
        yield dict(row._mapping)
