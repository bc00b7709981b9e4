"""The index a kind's sweep and reconciler walk: leading columns (due, id), as the keyset pages
read them. A kind whose table lacks one is refused, with the exact `CREATE INDEX` to add:
compiled by SQLAlchemy for the database at hand, partial on the kind's eligibility where the
database has partial indexes, its values rendered as literals by the compiler (quoted and
escaped, never pasted). On PostgreSQL it is `CREATE INDEX CONCURRENTLY`: built on a live table
without blocking its writes (run outside a transaction).
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import Index, inspect
from sqlalchemy.exc import CompileError, NoSuchTableError
from sqlalchemy.schema import CreateIndex
from sqlalchemy.sql.elements import True_

from lapse.kernel.kinds.columns import Bind, qualified
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.kinds.kind import CleanupKind

MAX_NAME = 63


def due_index(bind: Bind, kind: CleanupKind) -> str | None:
    """The name of an index of the kind's table whose leading columns are (due, id), if any."""
    table = kind.table
    try:
        indexes = inspect(bind).get_indexes(table.name, schema=table.schema)
    except NoSuchTableError:
        raise KindError("table", f"no table {show(qualified(table))}") from None
    wanted = [kind.due_column.name, kind.id_column.name]
    for index in indexes:
        if list(index["column_names"][:2]) == wanted:
            return index["name"] or "(unnamed)"
    return None


def index_name(kind: CleanupKind) -> str:
    base = re.sub(r"[^a-z0-9_]", "_", f"ix_{kind.table.name}_{kind.name}_due".lower())
    return base[:MAX_NAME]


def create_index_sql(bind: Bind, kind: CleanupKind) -> str:
    """`CREATE INDEX [CONCURRENTLY] … ON table (due, id) WHERE <eligibility>` for the database at
    hand (without the WHERE when there is no condition, or when the condition cannot be rendered as
    literals)."""
    where = kind.still_eligible
    partial: dict[str, Any] = {} if isinstance(where, True_) else {"postgresql_where": where, "sqlite_where": where}
    for options in (partial, {}):
        index = Index(index_name(kind), kind.due_column, kind.id_column, postgresql_concurrently=True, **options)
        try:
            return str(CreateIndex(index).compile(
                dialect=bind.dialect, compile_kwargs={"literal_binds": True})).strip()
        except CompileError:
            continue
        finally:
            kind.table.indexes.discard(index)
    raise AssertionError("a plain (due, id) index always compiles")


def require_due_index(bind: Bind, kind: CleanupKind) -> None:
    """KindError at `due` with the CREATE INDEX to add when the table has no (due, id) index."""
    if due_index(bind, kind) is None:
        raise KindError("due", f"no index on ({kind.due_column.name}, {kind.id_column.name}) of "
                               f"{qualified(kind.table)} for the sweep; add it: {create_index_sql(bind, kind)}")
