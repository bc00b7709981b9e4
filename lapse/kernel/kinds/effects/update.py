"""`effect: {update: {set: {column: value, …}}}`: set columns of the due, still eligible rows."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict, Field

from lapse.kernel.kinds.effects.base import CompileContext, EffectType, set_values
from lapse.kernel.kinds.statements import update_rows


class UpdateEffect(EffectType):
    """Set columns of the due, still eligible rows: literal values, or `now` for a timestamp."""

    model_config = ConfigDict(strict=True, populate_by_name=False)
    tag: ClassVar[str] = "update"

    set_: dict[str, Any] = Field(alias="set", min_length=1, max_length=100)

    def compile(self, ctx: CompileContext) -> dict[str, Any]:
        values = set_values(ctx.table, self.set_, f"{self.field}.set", ctx.id_column, ctx.dialect)
        return {"apply_in_db": update_rows(ctx.table, ctx.id_column, ctx.due_column, ctx.eligible, values,
                                               ctx.generation)}

    def privileges(self) -> list[str]:
        return ["SELECT", "UPDATE"]
