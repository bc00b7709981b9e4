"""A declared kind compiled against its reflected table into the `CleanupKind` the rooms use.

Conditions become SQLAlchemy expressions over the table's own columns with bound values; the
effect becomes a conditional UPDATE or DELETE, or an external effect whose declaration (URL
placeholders, key column, then_set) was checked against the same columns. Negations hold for
NULL too (`{not: x}` and `{not_in: [...]}` match a row whose column is null), as they read.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from sqlalchemy import Column, ColumnElement, MetaData, String, Table, and_, func, literal, or_, true
from sqlalchemy.sql.elements import NamedColumn

from lapse.kernel.kinds.columns import (
    Bind,
    check_id_column,
    column_of,
    fit,
    has_timezone,
    is_timestamp,
    reflect,
    reflected_type,
    settable,
    split_table_name,
    subject_parser,
)
from lapse.kernel.kinds.declarations import Condition, DeclaredKind
from lapse.kernel.kinds.effects import HttpEffect, ObjectStoreEffect
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.kinds.kind import CleanupKind, ExternalEffect
from lapse.kernel.kinds.statements import delete_rows, mark_done, read_targets, update_rows
from lapse.kernel.models import SCHEMA as LAPSE_SCHEMA

DEFAULT_TENANT = "default"
TENANT_LABEL = "lapse_tenant"
CALL_PLACEHOLDERS = {"op_key", "subject_id", "tenant"}  # filled from the call, not the row


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
    """The tenant column, null read as 'default'; a constant 'default' when the table has none."""
    if name is None:
        return literal(DEFAULT_TENANT, String()).label(TENANT_LABEL)
    column = column_of(table, name, "tenant")
    if not isinstance(reflected_type(column), String):
        raise KindError("tenant", f"column {show(column.name)} has type {reflected_type(column)}; "
                                  "a tenant is a text column")
    if column.name in taken:
        raise KindError("tenant", f"column {show(column.name)} is already the id or due column")
    if column.nullable:
        return func.coalesce(column, DEFAULT_TENANT).label(column.name)
    return column


def set_values(table: Table, values: dict[str, Any], field: str, id_column: Column[Any],
               dialect: str) -> dict[Column[Any], Any]:
    """Columns an effect sets and their checked values (`now` as the NOW marker)."""
    out: dict[Column[Any], Any] = {}
    for name, value in values.items():
        where = f"{field}.{show(name, bare=True)}"
        column = column_of(table, name, where)
        if column is id_column:
            raise KindError(where, "an effect does not change the id column")
        out[column] = settable(column, value, where, dialect)
    return out


def url_placeholders(url: str, table: Table, field: str) -> None:
    """Every `{name}` of a URL template is a column of the table or op_key/subject_id/tenant."""
    try:
        parts = list(string.Formatter().parse(url))
    except ValueError as exc:
        raise KindError(field, f"not a URL template: {exc}") from None
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if spec or conversion:
            raise KindError(field, f"placeholder {show(name)} takes no format spec or conversion")
        if name not in CALL_PLACEHOLDERS:
            column_of(table, name, field)


def http_effect(declared: HttpEffect, table: Table) -> HttpEffect:
    if not declared.url.lower().startswith(("http://", "https://")):
        raise KindError("effect.http.url", "expected an http:// or https:// URL template")
    url_placeholders(declared.url, table, "effect.http.url")
    return declared


def object_store_effect(declared: ObjectStoreEffect, table: Table, base_dir: Path) -> ObjectStoreEffect:
    """Check the store URL and key column; a relative `file:` folder resolves against `base_dir`
    (the kinds file's folder), and the declaration handed on holds the absolute form."""
    field = "effect.object-store"
    key = column_of(table, declared.key_column, f"{field}.key_column")
    if not isinstance(reflected_type(key), String):
        raise KindError(f"{field}.key_column", f"column {show(key.name)} is not a text column")
    url = declared.url
    if url.startswith("file:"):
        raw = url.removeprefix("file:")
        raw = raw[2:] if raw.startswith("//") else raw
        if not raw or "\0" in raw:
            raise KindError(f"{field}.url", "file: takes a folder, e.g. file:objects")
        folder = (base_dir / raw).resolve()
        return declared.model_copy(update={"url": f"file:{folder}"})
    if url.startswith("s3://"):
        bucket = url.removeprefix("s3://").partition("/")[0]
        if not 3 <= len(bucket) <= 63 or not all(c.islower() or c.isdigit() or c in ".-" for c in bucket):
            raise KindError(f"{field}.url", f"no S3 bucket name in {show(url)}")
        if declared.endpoint_url is not None and not declared.endpoint_url.startswith(("http://", "https://")):
            raise KindError(f"{field}.endpoint_url", "expected an http:// or https:// URL")
        return declared
    raise KindError(f"{field}.url", "expected s3://bucket[/prefix] or file:FOLDER")


def compile_declared(name: str, decl: DeclaredKind, bind: Bind, metadata: MetaData, base_dir: Path,
                     lapse_schema: str | None = None) -> CleanupKind:
    """The CleanupKind of one declaration, its names and values checked against the reflected
    table; KindError names the field at fault."""
    dialect = bind.dialect.name
    schema, _ = split_table_name(decl.table)
    if schema is not None and schema in {LAPSE_SCHEMA, lapse_schema}:
        raise KindError("table", f"{show(decl.table)} is in Lapse's own schema; kinds clean up business tables")
    if schema is not None and (schema.startswith("pg_") or schema == "information_schema"):
        raise KindError("table", f"{show(decl.table)} is in a system schema; kinds clean up business tables")
    table = reflect(bind, metadata, decl.table)
    id_column = column_of(table, decl.id, "id")
    check_id_column(id_column)
    due_column = column_of(table, decl.due, "due")
    if due_column is id_column or not has_timezone(due_column, dialect):
        raise KindError("due", f"column {show(due_column.name)} is not a timestamp with time zone")
    tenant = tenant_expression(table, decl.tenant, {id_column.name, due_column.name})
    eligible = eligibility(table, decl.eligible, dialect)
    effect = decl.effect
    common: dict[str, Any] = {
        "name": name, "table": table, "id_column": id_column, "tenant_column": tenant,
        "due_column": due_column, "still_eligible": eligible,
        "parse_subject": subject_parser(id_column, dialect),
        "max_attempts": decl.retry.max_attempts, "retry_base_s": decl.retry.base_s,
        "retry_cap_s": decl.retry.cap_s, "rate_limited_for_s": decl.retry.rate_limited_for_s,
    }
    if effect.update is not None:
        values = set_values(table, effect.update.set_, "effect.update.set", id_column, dialect)
        return CleanupKind(**common, apply_in_db=update_rows(table, id_column, due_column, eligible, values))
    if effect.delete is not None:
        return CleanupKind(**common, apply_in_db=delete_rows(table, id_column, due_column, eligible))
    if effect.http is not None:
        declared: HttpEffect | ObjectStoreEffect = http_effect(effect.http, table)
        field = "effect.http.then_set"
    else:
        assert effect.object_store is not None  # EffectDecl holds exactly one
        declared = object_store_effect(effect.object_store, table, base_dir)
        field = "effect.object-store.then_set"
    then_set = set_values(table, declared.then_set, field, id_column, dialect)
    external = ExternalEffect(read_targets(table, id_column, due_column, eligible),
                              mark_done(table, id_column, eligible, then_set), declared=declared)
    if decl.rate_per_s is not None:
        common["effect_rate_per_s"] = decl.rate_per_s
    return CleanupKind(**common, external_effect=external, idempotent_effect=True)
