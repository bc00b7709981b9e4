"""The index a kind's sweep and reconciler walk: leading columns (due, id), as the keyset pages
read them. A kind whose table lacks one is refused, with the exact `CREATE INDEX` to add:
compiled by SQLAlchemy for the database at hand, partial on the kind's eligibility where the
database has partial indexes, its values rendered as literals by the compiler (quoted and
escaped, never pasted). On PostgreSQL it is `CREATE INDEX CONCURRENTLY`: built on a live table
without blocking its writes (run outside a transaction). A kind whose tenant is a column is also
suggested an index on (tenant, due, id): the sweep's fair shares read each tenant's due rows along
it (docs/design/limits.md); without it they walk the due index past other tenants' rows.
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


def _leading(bind: Bind, kind: CleanupKind, columns: list[str]) -> str | None:
    """The name of an index of the kind's table whose leading columns are `columns`, if any."""
    table = kind.table
    try:
        indexes = inspect(bind).get_indexes(table.name, schema=table.schema)
    except NoSuchTableError:
        raise KindError("table", f"no table {show(qualified(table))}") from None
    for index in indexes:
        if list(index["column_names"][:len(columns)]) == columns:
            return index["name"] or "(unnamed)"
    return None


def due_index(bind: Bind, kind: CleanupKind) -> str | None:
    """The name of an index of the kind's table whose leading columns are (due, id), if any."""
    return _leading(bind, kind, [kind.due_column.name, kind.id_column.name])


def tenant_index(bind: Bind, kind: CleanupKind) -> str | None:
    """The name of an index of the kind's table whose leading columns are (tenant, due, id), if any."""
    return _leading(bind, kind, [str(kind.tenant_index_column), kind.due_column.name, kind.id_column.name])


def index_name(kind: CleanupKind, what: str = "due") -> str:
    base = re.sub(r"[^a-z0-9_]", "_", f"ix_{kind.table.name}_{kind.name}_{what}".lower())
    return base[:MAX_NAME]


def create_index_sql(bind: Bind, kind: CleanupKind, *, by_tenant: bool = False) -> str:
    """`CREATE INDEX [CONCURRENTLY] … ON table ([tenant,] due, id) WHERE <eligibility>` for the
    database at hand (without the WHERE when there is no condition, or when the condition cannot be
    rendered as literals)."""
    where = kind.still_eligible
    partial: dict[str, Any] = {} if isinstance(where, True_) else {"postgresql_where": where, "sqlite_where": where}
    columns = [kind.table.c[str(kind.tenant_index_column)]] if by_tenant else []
    name = index_name(kind, "tenant_due" if by_tenant else "due")
    for options in (partial, {}):
        index = Index(name, *columns, kind.due_column, kind.id_column, postgresql_concurrently=True, **options)
        try:
            return str(CreateIndex(index).compile(
                dialect=bind.dialect, compile_kwargs={"literal_binds": True})).strip()
        except CompileError:
            continue
        finally:
            kind.table.indexes.discard(index)
    raise AssertionError("a plain (due, id) index always compiles")


def tenant_index_suggestion(bind: Bind, kind: CleanupKind) -> str | None:
    """What `lapse kinds check` suggests when a kind whose tenant is a column has no (tenant, due,
    id) index: the CREATE INDEX to add (a suggestion: the kind runs without it); None otherwise."""
    if kind.tenant_index_column is None or tenant_index(bind, kind) is not None:
        return None
    return (f"tenant: no index on ({kind.tenant_index_column}, {kind.due_column.name}, {kind.id_column.name}) for the "
            f"sweep's fair shares across tenants; add it: {create_index_sql(bind, kind, by_tenant=True)}")


def require_due_index(bind: Bind, kind: CleanupKind) -> None:
    """KindError at `due` with the CREATE INDEX to add when the table has no (due, id) index."""
    if due_index(bind, kind) is None:
        raise KindError("due", f"no index on ({kind.due_column.name}, {kind.id_column.name}) of "
                               f"{qualified(kind.table)} for the sweep; add it: {create_index_sql(bind, kind)}")
