"""What `lapse kinds list` and `lapse kinds check` report: each kind as declared, and each kind
against the live database (its columns and types, its due index, the role's privileges), every
kind checked even when an earlier one failed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Engine, MetaData, func, select

from lapse.kernel.kinds.columns import Bind, qualified
from lapse.kernel.kinds.declarations import DeclaredKind, KindsFile
from lapse.kernel.kinds.effects.python import PythonKind
from lapse.kernel.kinds.errors import KindError
from lapse.kernel.kinds.indexes import create_index_sql, due_index, tenant_index_suggestion
from lapse.kernel.kinds.kind import CleanupKind
from lapse.kernel.kinds.loading import compile_kind, load_kind
from lapse.kernel.topology import Topology


@dataclass
class KindCheck:
    """One kind against the database: `problems` is empty when it is ready to run."""

    name: str
    effect: str
    table: str | None = None
    problems: list[str] = field(default_factory=list)
    due_index: str | None = None
    create_index: str | None = None
    privileges: dict[str, bool] = field(default_factory=dict)
    suggestions: list[str] = field(default_factory=list)  # what would help, the kind running without it

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def describe(kinds_file: KindsFile) -> list[dict[str, Any]]:
    """Each kind as the file says it (no database): name, table, effect, due column, conditions."""
    out: list[dict[str, Any]] = []
    for name, decl in kinds_file.kinds.items():
        if isinstance(decl, DeclaredKind):
            out.append({"name": name, **decl.summary()})
            continue
        row: dict[str, Any] = {"name": name, **decl.summary()}
        try:
            kind = load_kind(decl.python)
            row.update(table=qualified(kind.table), id=kind.id_column.name, due=kind.due_column.name)
        except ValueError as exc:
            row["error"] = str(exc)
        out.append(row)
    return out


def privileges(bind: Bind, kind: CleanupKind, wanted: list[str]) -> dict[str, bool]:
    """has_table_privilege for the current role on PostgreSQL (SQLite has no roles: all true)."""
    if bind.dialect.name != "postgresql":
        return dict.fromkeys(wanted, True)
    name = bind.dialect.identifier_preparer.format_table(kind.table)
    stmt = select(*(func.has_table_privilege(name, p).label(p.lower()) for p in wanted))
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            row = conn.execute(stmt).one()
    else:
        row = bind.execute(stmt).one()
    return {p: bool(v) for p, v in zip(wanted, row, strict=True)}


def check_kinds(kinds_file: KindsFile, bind: Bind, lapse_schema: str | None = None,
                topology: Topology | None = None) -> list[KindCheck]:
    """Every kind of the file against the live database (and `topology`: the topics effects name)."""
    metadata = MetaData()
    base_dir = kinds_file.path.resolve().parent
    checks: list[KindCheck] = []
    for name, decl in kinds_file.kinds.items():
        check = KindCheck(name, "python" if isinstance(decl, PythonKind) else decl.effect.tag)
        checks.append(check)
        try:
            kind = compile_kind(name, decl, bind, metadata, base_dir, lapse_schema, topology)
            check.table = qualified(kind.table)
            check.due_index = due_index(bind, kind)
        except KindError as exc:
            check.problems.append(str(exc))
            continue
        if check.due_index is None:
            check.create_index = create_index_sql(bind, kind)
            check.problems.append(f"due: no index on ({kind.due_column.name}, {kind.id_column.name}); "
                                  f"add it: {check.create_index}")
        suggestion = tenant_index_suggestion(bind, kind)
        check.suggestions += [suggestion] if suggestion else []
        check.privileges = privileges(bind, kind, decl.privileges())
        missing = [p for p, allowed in check.privileges.items() if not allowed]
        if missing:
            check.problems.append(f"table: the current role may not {', '.join(missing)} {check.table}")
    return checks
