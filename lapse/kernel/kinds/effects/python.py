"""`python: package.module:ATTRIBUTE`: a kind written in Python, for what declarations cannot say.
Its effect is its own (`CleanupKind.apply_in_db`, or `ExternalEffect.call`: processors/effects/python)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from lapse.kernel.kinds.brakes import BUDGET_HELP, MODE_HELP, BudgetField, Mode
from lapse.kernel.kinds.limits import LIMITS_HELP, PRIORITY_HELP, WEIGHTS_HELP, LimitsDecl, Priority, checked_weights


class PythonKind(BaseModel):
    """A kind written in Python, for what declarations cannot say: `package.module:ATTRIBUTE`."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=False)

    python: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$", max_length=300)
    mode: Mode = Field("live", description=MODE_HELP)
    budget: BudgetField = Field(None, description=BUDGET_HELP)
    limits: LimitsDecl | None = Field(None, description=LIMITS_HELP + " Only for a kind whose effect is external.")
    priority: Priority = Field("normal", description=PRIORITY_HELP)
    tenant_weights: Annotated[dict[str, float], BeforeValidator(checked_weights)] = Field(
        default_factory=dict, description=WEIGHTS_HELP)

    def summary(self) -> dict[str, Any]:
        return {"python": self.python, "effect": "python"}

    def privileges(self) -> list[str]:
        """A Python kind's table is read; what its own effect needs, it checks itself."""
        return ["SELECT"]
