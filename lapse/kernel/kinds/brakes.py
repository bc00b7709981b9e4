"""What a kind declares about its brakes: its mode (live, or shadow: the whole pipeline with the
effect replaced by a record of what it would do) and its blast-radius budget.

A budget is `{max_effects: N, per: 1h}` (optionally `per_tenant: true`), or `false` for none. A
kind that says nothing gets none, except a destructive one (delete, object-store), which gets
DEFAULT_DESTRUCTIVE: a wrong `eligible:` clause then removes at most that many rows an hour before
the kind pauses itself and an operator looks.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from lapse.kernel.brakes import Budget

Mode = Literal["live", "shadow"]
MODE_HELP = ("`live` applies the effect; `shadow` runs the whole pipeline but records what the effect would "
             "do instead (`lapse kinds plan --compare`); switched back to live, each operation is applied once.")
BUDGET_HELP = ("At most so many effects in any window, counted for every worker at once: reaching it pauses the "
               "kind until an operator resumes it. `false`: none. Unset: 10,000 per hour for a delete or "
               "object-store effect, none otherwise.")
MAX_EFFECTS = 10_000_000
MAX_WINDOW_S = 7 * 86_400
_DURATION = re.compile(r"^([1-9][0-9]{0,6})(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
LIMITS, OFF = "max-effects", "off"  # the budget union's member tags (not field names)
BRAKE_TAGS = frozenset({LIMITS, OFF})  # the budget union's member tags, left out of error paths


def window_seconds(text: str) -> int:
    """`30s`, `15m`, `1h`, `1d` as seconds, 1 s to 7 days; ValueError with the rule otherwise."""
    match = _DURATION.match(text)
    seconds = int(match[1]) * _UNIT_S[match[2]] if match else 0
    if not 1 <= seconds <= MAX_WINDOW_S:
        raise ValueError(f"a budget's window is a duration like 30m, 1h or 1d, at most 7d, not {text!r}")
    return seconds


class BudgetDecl(BaseModel):
    """At most `max_effects` effects in any window of `per` (`30m`, `1h`, `1d`; at most `7d`), of
    the kind or, with `per_tenant`, of each of its tenants; reaching it pauses the kind (or tenant)
    with cause `budget` until an operator resumes it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, populate_by_name=False)

    max_effects: int = Field(ge=1, le=MAX_EFFECTS)
    per: str = Field(max_length=16)
    per_tenant: bool = False

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        if not isinstance(value, (dict, BudgetDecl)):
            raise ValueError("expected {max_effects: N, per: 1h} or false (no budget)")
        return value

    @model_validator(mode="after")
    def _window(self) -> BudgetDecl:
        window_seconds(self.per)
        return self

    def budget(self) -> Budget:
        return Budget(self.max_effects, float(window_seconds(self.per)), self.per_tenant)


def _budget_tag(value: Any) -> str:
    return OFF if value is False else LIMITS


BudgetField = Annotated[
    Annotated[BudgetDecl, Tag(LIMITS)] | Annotated[Literal[False], Tag(OFF)],
    Discriminator(_budget_tag),
] | None

DEFAULT_DESTRUCTIVE = BudgetDecl(max_effects=10_000, per="1h")


def effective_budget(declared: BudgetDecl | Literal[False] | None, destructive: bool) -> Budget | None:
    """The budget a kind runs with: the declared one, none for `false`, else the default of a
    destructive effect (DEFAULT_DESTRUCTIVE) or none."""
    if declared is False:
        return None
    if declared is None:
        return DEFAULT_DESTRUCTIVE.budget() if destructive else None
    return declared.budget()
