"""A declared kind compiled against its reflected table into the `CleanupKind` the rooms use.

Conditions become SQLAlchemy expressions over the table's own columns with bound values; the
effect compiles itself (`effects`): a conditional UPDATE or DELETE, or an external effect whose
declaration (URL placeholders, key column, topic, then_set) was checked against the same columns.
Negations hold for NULL too (`{not: x}` and `{not_in: [...]}` match a row whose column is null),
as they read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    Uuid,
    and_,
    cast,
    func,
    literal,
    or_,
    text,
    true,
)
from sqlalchemy.sql.elements import NamedColumn

from lapse.kernel.database import TABLE_PREFIX
from lapse.kernel.kinds.brakes import effective_budget
from lapse.kernel.kinds.columns import (
    Bind,
    check_id_column,
    column_of,
    fit,
    has_timezone,
    is_timestamp,
    reflect,
    reflected_type,
    split_table_name,
    subject_parser,
)
from lapse.kernel.kinds.declarations import Condition, DeclaredKind
from lapse.kernel.kinds.effects.base import CompileContext
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.kinds.generations import generation_of
from lapse.kernel.kinds.kind import CleanupKind
from lapse.kernel.models import SCHEMA as LAPSE_SCHEMA
from lapse.kernel.topology import Topology

DEFAULT_TENANT = "default"
TENANT_LABEL = "lapse_tenant"


def condition(column: Column[Any], cond: Condition, field: str, dialect: str) -> ColumnElement[bool]:
    """One declared condition as an expression with bound values."""
    values = cond.value if cond.op in ("in", "not_in") else (cond.value,)
    if any(isinstance(v, str) and any(c < " " for c in v) for v in values):
        raise KindError(field, "a condition value holds no control characters")
    if is_timestamp(column) and cond.value is not None:
        raise KindError(field, f"timestamp column {show(column.name)} takes only null or {{not: null}} here")
    if cond.op == "eq":
        return column.is_(None) if cond.value is None else column == fit(column, cond.value, field, dialect)
    if cond.op == "ne":
        if cond.value is None:
            return column.is_not(None)
        value = fit(column, cond.value, field, dialect)
        return column.is_distinct_from(value) if column.nullable else column != value
    fitted = [fit(column, v, field, dialect) for v in values]
    if cond.op == "in":
        return column.in_(fitted)
    return or_(column.is_(None), column.not_in(fitted)) if column.nullable else column.not_in(fitted)


def eligibility(table: Table, conditions: dict[str, Condition], dialect: str) -> ColumnElement[bool]:
    """Every condition of `eligible`, all of which must hold (true when there are none)."""
    parts = [condition(column_of(table, name, f"eligible.{show(name, bare=True)}"), cond,
                       f"eligible.{show(name, bare=True)}", dialect)
             for name, cond in conditions.items()]
    return and_(*parts) if parts else true()


def tenant_expression(table: Table, name: str | None, taken: set[str]) -> NamedColumn[Any]:
    """The tenant as text, as events and the ledger carry it: a text column as it is, a uuid or an
    integer column cast to text in the select (the database's own spelling: lowercase uuid with
    dashes, decimal digits); null read as 'default'; a constant 'default' when the table has none.
    The tenant is only ever selected along the id or due index, never looked up by."""
    if name is None:
        return literal(DEFAULT_TENANT, String()).label(TENANT_LABEL)
    column = column_of(table, name, "tenant")
    kind = reflected_type(column)
    if not isinstance(kind, (String, Uuid, Integer)):
        raise KindError("tenant", f"column {show(column.name)} has type {kind}; a tenant is a text, uuid or "
                                  "integer column")
    if column.name in taken:
        raise KindError("tenant", f"column {show(column.name)} is already the id or due column")
    text: ColumnElement[Any] = column if isinstance(kind, String) else cast(column, String())
    if column.nullable:
        return func.coalesce(text, DEFAULT_TENANT).label(column.name)
    return column if text is column else text.label(column.name)


def resolved_schema(bind: Bind, table: Table) -> str | None:
    """The schema `table` really is in: its own, or for a bare name the schema PostgreSQL's search
    path finds it in (as every statement on it will); None for SQLite's one namespace."""
    if table.schema is not None or bind.dialect.name != "postgresql":
        return table.schema
    query = text("SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
                 "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(:name)")
    params = {"name": bind.dialect.identifier_preparer.quote(table.name)}
    if isinstance(bind, Connection):
        return bind.execute(query, params).scalar()
    with bind.connect() as conn:
        return conn.execute(query, params).scalar()


def refuse_own_tables(bind: Bind, name: str, schema: str | None, lapse_schema: str | None) -> None:
    """KindError at `table` when the table named `name` lives in `schema` and that is Lapse's own
    schema (as configured, or as the engine maps it) or a system schema; on SQLite, whose one
    namespace Lapse shares, when its name has Lapse's table prefix."""
    translated = (bind.get_execution_options().get("schema_translate_map") or {}).get(LAPSE_SCHEMA)
    bare = split_table_name(name)[1]
    if schema is not None and schema in {LAPSE_SCHEMA, lapse_schema, translated}:
        raise KindError("table", f"{show(name)} is in Lapse's own schema; kinds clean up business tables")
    if schema is not None and (schema.startswith("pg_") or schema == "information_schema"):
        raise KindError("table", f"{show(name)} is in a system schema; kinds clean up business tables")
    if bind.dialect.name == "sqlite" and bare.lower().startswith(TABLE_PREFIX):
        raise KindError("table", f"{show(name)} is one of Lapse's own tables; kinds clean up business tables")


def compile_declared(name: str, decl: DeclaredKind, bind: Bind, metadata: MetaData, base_dir: Path,
                     lapse_schema: str | None = None, topology: Topology | None = None) -> CleanupKind:
    """The CleanupKind of one declaration, its names and values checked against the reflected
    table (and the topology, for an effect that names a topic); KindError names the field at fault."""
    dialect = bind.dialect.name
    refuse_own_tables(bind, decl.table, split_table_name(decl.table)[0], lapse_schema)
    table = reflect(bind, metadata, decl.table)
    refuse_own_tables(bind, decl.table, resolved_schema(bind, table), lapse_schema)
    id_column = column_of(table, decl.id, "id")
    check_id_column(id_column)
    due_column = column_of(table, decl.due, "due")
    if due_column is id_column or not has_timezone(due_column, dialect):
        raise KindError("due", f"column {show(due_column.name)} is not a timestamp with time zone")
    tenant = tenant_expression(table, decl.tenant, {id_column.name, due_column.name})
    eligible = eligibility(table, decl.eligible, dialect)
    common: dict[str, Any] = {
        "name": name, "table": table, "id_column": id_column, "tenant_column": tenant,
        "due_column": due_column, "still_eligible": eligible,
        "parse_subject": subject_parser(id_column, dialect),
        "max_attempts": decl.retry.max_attempts, "retry_base_s": decl.retry.base_s,
        "retry_cap_s": decl.retry.cap_s, "rate_limited_for_s": decl.retry.rate_limited_for_s,
    }
    if decl.limits is not None:
        common["limits"] = decl.limits.limits()
    common["priority"] = decl.priority
    common["tenant_weights"] = dict(decl.tenant_weights)
    generation = (None if decl.generation is None
                  else generation_of(table, decl.generation, {id_column.name, due_column.name}, dialect))
    context = CompileContext(table, id_column, due_column, eligible, dialect, base_dir, topology, generation)
    common["generation"] = generation
    common["mode"] = decl.mode
    common["budget"] = effective_budget(decl.budget, decl.effect.destructive)
    return CleanupKind(**common, **decl.effect.compile(context))
