"""`effect: {delete:}` (or `delete: {}`): delete the due, still eligible rows."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict

from lapse.kernel.kinds.effects.base import CompileContext, EffectType
from lapse.kernel.kinds.statements import delete_rows


class DeleteEffect(EffectType):
    """Delete the due, still eligible rows."""

    model_config = ConfigDict(strict=True)
    tag: ClassVar[str] = "delete"
    destructive: ClassVar[bool] = True

    def compile(self, ctx: CompileContext) -> dict[str, Any]:
        return {"apply_in_db": delete_rows(ctx.table, ctx.id_column, ctx.due_column, ctx.eligible,
                                               ctx.generation)}

    def privileges(self) -> list[str]:
        return ["SELECT", "DELETE"]
