"""What every declarable effect type is: a pydantic model that compiles itself against the
reflected table and says which privileges its table needs.

An effect type is one module of this package holding one `EffectType` subclass (its `tag` is the
key the kinds file writes under `effect:`), registered once in `registry`. An in-database type
returns `apply_in_db` from `compile`; an external one (`ExternalEffectType`) checks its
declaration against the table and is run under a lease by the caller `processors/effects` builds
for its tag.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Column, ColumnElement, Table

from lapse.kernel.kinds.columns import column_of, settable
from lapse.kernel.kinds.errors import KindError, show
from lapse.kernel.kinds.generations import Generation
from lapse.kernel.kinds.kind import ExternalEffect
from lapse.kernel.kinds.statements import mark_done, read_targets
from lapse.kernel.topology import Topology


@dataclass(frozen=True)
class CompileContext:
    """What an effect is compiled against: the reflected table with the kind's id and due
    columns and eligibility, the database dialect, the kinds file's folder (relative paths), the
    topology (topics an effect names) when the caller has one, and the kind's generation if any."""

    table: Table
    id_column: Column[Any]
    due_column: Column[Any]
    eligible: ColumnElement[bool]
    dialect: str
    base_dir: Path
    topology: Topology | None = None
    generation: Generation | None = None


class EffectType(BaseModel):
    """One declarable effect type; `tag` is its key under `effect:` in the kinds file."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tag: ClassVar[str]
    external: ClassVar[bool] = False  # run outside the database, under a lease
    destructive: ClassVar[bool] = False  # removes data: a budget by default (kinds.brakes)

    @property
    def field(self) -> str:
        """The dotted path of this declaration in a kind, for error messages."""
        return f"effect.{self.tag}"

    def compile(self, ctx: CompileContext) -> dict[str, Any]:
        """The CleanupKind fields this effect sets (`apply_in_db`, or `external_effect`);
        KindError naming the field when the declaration does not fit the table."""
        raise NotImplementedError

    def privileges(self) -> list[str]:
        """What the database role must be allowed on the table."""
        return ["SELECT"]


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


class ExternalEffectType(EffectType):
    """An effect outside the database: the call runs under a lease, then `then_set` (if any) is
    set on the business rows still eligible, in the completion transaction."""

    external: ClassVar[bool] = True
    then_set: dict[str, Any]

    def checked(self, ctx: CompileContext) -> ExternalEffectType:
        """The declaration checked against the table, as the caller gets it."""
        return self

    def compile(self, ctx: CompileContext) -> dict[str, Any]:
        declared = self.checked(ctx)
        then_set = set_values(ctx.table, declared.then_set, f"{self.field}.then_set", ctx.id_column, ctx.dialect)
        external = ExternalEffect(read_targets(ctx.table, ctx.id_column, ctx.due_column, ctx.eligible, ctx.generation),
                                  mark_done(ctx.table, ctx.id_column, ctx.eligible, then_set, ctx.generation),
                                  declared=declared)
        return {"external_effect": external, "idempotent_effect": True}

    def privileges(self) -> list[str]:
        return ["SELECT", "UPDATE"] if self.then_set else ["SELECT"]
